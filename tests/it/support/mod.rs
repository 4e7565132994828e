//! Test-only helpers shared by every suite.

pub mod exchange;
pub mod proxy_process;
pub mod realenv;
pub mod wire;
