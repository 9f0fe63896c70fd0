//! io_uring UDP datapath (being written).
