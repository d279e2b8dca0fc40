//! [`DiskConfig`]: how a [`DiskTier`](super::DiskTier) stores.

/// How a [`DiskTier`](super::DiskTier) stores: [`DiskConfig::default`] and the `with_*` setters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DiskConfig {
    /// Most bytes of pack files kept (file contents, tables included; directory entries and
    /// file-system blocks are not counted).
    pub capacity_bytes: u64,
    /// The largest value accepted, read or indexed: the largest chunk the layout can
    /// produce (the bound is the smaller of this and what a pack of one value within
    /// `capacity_bytes` holds: the capacity less 56 bytes of table). It also bounds the
    /// largest pack file read or indexed (1,024 entries' table and the larger of 4 MiB — less
    /// where `capacity_bytes` is smaller: what it holds beside that table — and this): a file at a pack's path longer than that is not one the tier wrote, so `get`
    /// reads it as absent and [`DiskTier::open`](super::DiskTier::open) neither indexes nor
    /// counts it.
    pub max_value_bytes: u64,
    /// Flush every pack file before it is linked into place and the directory after (off by
    /// default).
    /// Off, a put survives a killed process but not necessarily a power loss; on, a put that
    /// returned survives a power loss too (on a drive that honours flushes), at the cost of
    /// two flushes per pack (a put of up to 1,024 chunks and 4 MiB). See the repository's
    /// `docs/kv-format.md`, "Disk tier".
    pub fsync: bool,
}

with_setters!(DiskConfig {
    with_capacity_bytes: capacity_bytes: u64,
    with_max_value_bytes: max_value_bytes: u64,
    with_fsync: fsync: bool,
});

impl Default for DiskConfig {
    /// 1 GiB, values up to 64 MiB, no fsync.
    fn default() -> Self {
        DiskConfig {
            capacity_bytes: 1 << 30,
            max_value_bytes: 64 << 20,
            fsync: false,
        }
    }
}
