//! Difficulty proposers that are plugins (the method's own rules, `Static` and `Threshold`,
//! live in the framework).

pub mod gp;

pub use gp::{Gp, GpSpec};
