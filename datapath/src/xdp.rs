//! AF_XDP datapath (being written).
