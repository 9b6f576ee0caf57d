//! Reverted fixes, for the simulation's mutation proof (`sim/`): with the
//! `mutations` feature a test thread may switch one on, and the rule that
//! cites it behaves as it did before the fix. Without the feature (the
//! extension's build) [`active`] is `false` and the compiler drops the
//! old behaviour.

/// A fix of the registry's or the holder's rules, reverted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Mutation {
    /// A grant counts as durable whatever the standbys flushed (a commit
    /// whose synchronous wait was cancelled is trusted).
    TrustCancelledCommit = 1,
    /// A fence rests on the lease times and marks requests carried (which
    /// a failover loses with the grants), not on the limits.
    FenceFromRequests,
    /// A release sets the mark it is given, below the floor too.
    ReleaseBelowFloor,
    /// A node's blocks pass to any session of that node.
    BlocksToAnySession,
    /// The promoted server's candidate name comes from a session (it can
    /// name any candidate).
    CandidateFromSession,
    /// A candidates' row's `valid_until` may move back.
    ValidUntilBack,
    /// Grants are committed asynchronously: a crash of the registry loses
    /// the last ones without the WAL position going back for good.
    AsyncGrantCommit,
    /// A session that gave up its node's lock may introduce another node
    /// while it holds blocks of the first (`snowflake_lease_hello`).
    ManyNodesPerSession,
    /// `max_blocks_per_role` bounds nothing: the sessions of one login
    /// role lease as many nodes' worth as they open sessions.
    NoRoleLimit,
    /// A row made anew counts, under a `*` in `synchronous_standby_names`,
    /// only the standbys streaming: one cut off before it is none of them.
    StarCountsStreamingOnly,
    /// A holder's incarnation that a registry restored in place never had
    /// is no evidence (no `history`).
    NoIncarnationHistory,
    /// [`Mutation::AsyncGrantCommit`] with the defence that also covers it
    /// reverted: a holder's signed grant count is no evidence. (Each
    /// alone is no duplicate; both are.)
    AsyncGrantCommitUncounted,
    /// The row's database is not checked: a copy of the registry's
    /// database put back in its place (no restart, the WAL moving on) is
    /// taken for the registry it copied.
    NoDatabaseIdentity,
    /// A candidates' row made anew names every standby that may be
    /// synchronous now, not the members of the last row this data
    /// directory wrote.
    NoKeptCandidates,
    /// A lowered limit bounds fences at once, while grants made under the
    /// higher one may still run.
    LoweredLimitsForgotten,
    /// A node's lock held by a session of any role shows the node in use
    /// (a copy of its server): a role that takes it, or holds it when the
    /// holder's session ends, makes that server take a new node id.
    NodeLockUnbound,
    /// A row whose grant count is below one a call found before (no
    /// restart) is taken for the registry's.
    NoRowBack,
}

impl Mutation {
    pub const ALL: [Mutation; 17] = [
        Mutation::TrustCancelledCommit,
        Mutation::FenceFromRequests,
        Mutation::ReleaseBelowFloor,
        Mutation::BlocksToAnySession,
        Mutation::CandidateFromSession,
        Mutation::ValidUntilBack,
        Mutation::AsyncGrantCommit,
        Mutation::ManyNodesPerSession,
        Mutation::NoRoleLimit,
        Mutation::StarCountsStreamingOnly,
        Mutation::NoIncarnationHistory,
        Mutation::AsyncGrantCommitUncounted,
        Mutation::NoDatabaseIdentity,
        Mutation::NoKeptCandidates,
        Mutation::LoweredLimitsForgotten,
        Mutation::NodeLockUnbound,
        Mutation::NoRowBack,
    ];
}

#[cfg(feature = "mutations")]
thread_local! {
    static ACTIVE: std::cell::Cell<u8> = const { std::cell::Cell::new(0) };
}

/// Switches `m` on (or every mutation off) for this thread.
#[cfg(feature = "mutations")]
pub fn set(m: Option<Mutation>) {
    ACTIVE.with(|a| a.set(m.map_or(0, |m| m as u8)));
}

/// Whether `m` is switched on in this thread.
#[inline]
pub fn active(m: Mutation) -> bool {
    #[cfg(feature = "mutations")]
    {
        ACTIVE.with(|a| a.get() == m as u8)
    }
    #[cfg(not(feature = "mutations"))]
    {
        let _ = m;
        false
    }
}
