//! The caps on what a lakeFS server may answer, and lakeFS's own limits.

/// lakeFS pages at most 1000 entries.
pub const MAX_PAGE: u32 = 1000;
/// The largest JSON answer read: a page of 1000 entries with 1024-byte keys and their stats
/// is a few MiB at most.
pub const MAX_JSON_ANSWER: usize = 8 << 20;
/// The most of an error answer read (its message is cut to 300 characters anyway).
pub const MAX_ERROR_ANSWER: usize = 64 << 10;
/// The largest object [`LakefsClient::get_object`] reads into memory (tests, `dev`).
pub const MAX_OBJECT_IN_MEMORY: usize = 64 << 20;
/// lakeFS keys (and so branch ids and paths listed) are at most 1024 bytes.
pub const MAX_KEY_BYTES: usize = 1024;
/// The longest object checksum kept (an MD5 is 32 hex characters, an S3 multipart ETag a few
/// more).
pub const MAX_CHECKSUM_BYTES: usize = 128;
/// The most branch protection rules read.
pub const MAX_PROTECTION_RULES: usize = 1000;
/// The most entries a diff or a branch listing holds.
pub const MAX_LISTED: usize = 100_000;
