//! Tool policy in both directions: which tools an agent may see and call
//! (`policy`, with `glob` for the names). Pure: no I/O.

pub mod glob;
pub mod policy;

pub use glob::Glob;
pub use policy::{ListHandling, Policy, ToolFlags};
