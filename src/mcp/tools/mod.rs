//! Tool policy in both directions: which tools an agent may see and call
//! (`policy`, with `glob` for the names), and the `tools/list` rewriter
//! that hides the others and the stamped identity parameters, and learns
//! new identity parameters from the server's schemas (`list`). Pure: no
//! I/O.

pub mod batch;
pub mod glob;
pub mod list;
pub mod policy;
pub mod stream;

pub use batch::{split_batch, BatchAnswer, BatchSplit};
pub use glob::Glob;
pub use list::{rewrite_list, Edit, Learned, ListEdit, ListError, ListKey, ListOptions};
pub use policy::{ListHandling, Policy, ToolFlags};
pub use stream::{ListFilter, ListReport, MAX_LIST_ANSWER};
