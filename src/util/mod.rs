//! What every stage shares: [`alloc`] (what jemalloc
//! does for the stages), [`files`] (every file written atomically, with a
//! private mode), [`guard`] (containing a panic to one unit of
//! work), [`timefmt`] (timestamps and durations as text), [`text`] (plural
//! words for summaries), [`wire`] (the HTTP header names between the remote
//! sender and the collector).

pub mod alloc;
pub mod files;
pub mod guard;
pub mod text;
pub mod timefmt;
pub mod wire;
