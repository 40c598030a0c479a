pub mod attest;
pub mod bench;
pub mod bench_gpu;
pub mod engine;
pub mod models;
pub mod config;
pub mod serve;
pub mod bench_model;
