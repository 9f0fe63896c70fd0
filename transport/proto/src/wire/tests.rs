//! The codec: round trips, golden bytes written by hand from the header diagrams in this
//! module, and rejection of truncated, corrupted, inconsistent and random input; the checked
//! view, the `Repr` level and the flags type.
use super::samples::{ALL_OPS, emit, header, request, sample_ack, samples, with_crc};
use super::*;
use crate::wire;

mod codes;
mod golden;
mod reject;
mod round_trip;
mod view;
