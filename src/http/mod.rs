//! Pure HTTP/1.1 layer: bytes in, values or offsets out. No I/O, no clock.

pub mod body;
pub mod chunked;
pub mod framing;
pub mod guard;
pub mod head;
pub mod headers;
pub mod write;
