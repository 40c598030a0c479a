//! Integration tests of the GELO protocol, in one binary.

mod bad_input;
mod bss;
mod gram;
mod parity;
mod support;
mod uverify;
