//! The registry's rules, each in a table test, and the invariants over
//! random call sequences (proptest) through the in-memory store.

use super::durable::{self, CandidatesRow, Standby};
use super::memory::Store;
use super::*;
use crate::protocol::{format_lsn, BlockMark, Invariant, Seen};
use proptest::prelude::*;

const T0: i64 = 1_795_305_600_000;
const LEASE: i64 = 6_000;
const GRACE: i64 = 1_200;

fn acquire(node: &str, want: i64, seen: Seen, now: i64) -> Call {
    Call::Acquire(AcquireRequest {
        node: node.into(),
        name: node.into(),
        layout: "classic".into(),
        block_size: 16,
        max_worker_id: 1023,
        allowed: (0..64).collect(),
        want,
        lease_ms: LEASE,
        grace_ms: GRACE,
        high_ms: now + LEASE + 1_000,
        seen,
    })
}

fn renew(node: &str, blocks: &[u32], seen: Seen, now: i64) -> Call {
    Call::Renew(RenewRequest {
        node: node.into(),
        layout: "classic".into(),
        block_size: 16,
        max_worker_id: 1023,
        blocks: blocks
            .iter()
            .map(|&b| BlockMark {
                block: b.into(),
                high_ms: 0,
            })
            .collect(),
        lease_ms: LEASE,
        grace_ms: GRACE,
        high_ms: now + LEASE + 1_000,
        seen,
        previous_session: String::new(),
    })
}

fn release(node: &str, block: u32, high_ms: i64, seen: Seen) -> Call {
    Call::Release(ReleaseRequest {
        node: node.into(),
        block: block.into(),
        high_ms,
        seen,
        previous_session: String::new(),
    })
}

fn seen_of(head: &crate::protocol::ReplyHead) -> Seen {
    Seen {
        incarnation: head.incarnation.clone(),
        lsn: head.lsn.clone(),
        grants: head.grants,
        token: head.token.clone(),
        earlier: Vec::new(),
    }
}

fn store_with(nodes: &[&str]) -> Store {
    let mut s = Store::created(T0, 7);
    for (i, n) in nodes.iter().enumerate() {
        let pid = 100 + i as u64;
        s.connect(pid, T0);
        assert_eq!(s.hello(pid, n), Ok(true));
    }
    s
}

fn incarnation(s: &Store) -> String {
    s.tables
        .rows
        .registry
        .as_ref()
        .map(|r| r.incarnation.clone())
        .unwrap_or_default()
}

#[test]
fn an_unbelieved_position_starts_no_incarnation() {
    // One `renew` with "lsn": "FFFFFFFF/FFFFFFFF" fenced a 0.7.0 registry.
    let mut s = store_with(&["a", "hostile"]);
    let first = incarnation(&s);
    let forged = Seen {
        incarnation: first.clone(),
        lsn: "FFFFFFFF/FFFFFFFF".into(),
        grants: 0,
        token: String::new(),
        earlier: Vec::new(),
    };
    let reply = s
        .lease(101, &acquire("hostile", 1, forged.clone(), T0), T0)
        .unwrap();
    assert_eq!(reply.head.incarnation, first);
    assert_eq!(reply.head.fenced_until_ms, None);
    // With a token the registry did not issue: the same.
    let forged = Seen {
        token: "00".repeat(16),
        ..forged
    };
    let reply = s
        .lease(101, &renew("hostile", &[], forged, T0), T0)
        .unwrap();
    assert_eq!(reply.head.incarnation, first);
    assert_eq!(reply.head.fenced_until_ms, None);
}

#[test]
fn after_the_extension_is_made_again_only_its_own_key_fences() {
    // The key is the data directory's: DROP EXTENSION leaves it, so a
    // token from before verifies and a forged one does not (0.8.0 before
    // this made a new key, and a forged token fenced a new registry once).
    let mut s = store_with(&["a", "hostile"]);
    let reply = s
        .lease(100, &acquire("a", 1, Seen::default(), T0), T0)
        .unwrap();
    let before = seen_of(&reply.head);
    s.disconnect(100);
    s.create_extension(T0 + 1_000);
    let made = incarnation(&s);
    assert!(!s.tables.rows.registry.as_ref().is_some_and(|r| r.new_key));
    let forged = Seen {
        incarnation: "0123456789abcdef0123456789abcdef".into(),
        token: "ab".repeat(16),
        ..before.clone()
    };
    let reply = s
        .lease(
            101,
            &acquire("hostile", 1, forged.clone(), T0 + 2_000),
            T0 + 2_000,
        )
        .unwrap();
    assert_eq!(reply.head.incarnation, made);
    assert_eq!(reply.head.fenced_until_ms, None);
    s.connect(102, T0 + 2_000);
    assert_eq!(s.hello(102, "a"), Ok(true));
    let reply = s
        .lease(102, &renew("a", &[], before, T0 + 3_000), T0 + 3_000)
        .unwrap();
    assert_ne!(reply.head.incarnation, made);
    assert!(reply.head.fenced_until_ms.is_some());
    // With the key file gone, the new key cannot verify older tokens: a
    // forged one fences (once).
    s.disconnect(101);
    s.disconnect(102);
    s.data_key = None;
    s.create_extension(T0 + 4_000);
    assert!(s.tables.rows.registry.as_ref().is_some_and(|r| r.new_key));
    s.connect(103, T0 + 4_000);
    assert_eq!(s.hello(103, "hostile"), Ok(true));
    let reply = s
        .lease(103, &acquire("hostile", 1, forged, T0 + 5_000), T0 + 5_000)
        .unwrap();
    assert!(reply.head.fenced_until_ms.is_some());
}

#[test]
fn a_signed_position_above_the_registrys_fences() {
    // A snapshot restored in place: a holder saw a later position of the
    // same incarnation, and its token proves it.
    let mut s = store_with(&["a"]);
    let snapshot = (s.tables.clone(), s.lsn);
    let reply = s
        .lease(100, &acquire("a", 1, Seen::default(), T0), T0)
        .unwrap();
    assert_eq!(reply.blocks.len(), 1);
    let seen = seen_of(&reply.head);
    s.tables = snapshot.0;
    s.lsn = snapshot.1;
    let now = T0 + 1_000;
    let reply = s
        .lease(100, &renew("a", &[reply.blocks[0].block], seen, now), now)
        .unwrap();
    let fenced = reply.head.fenced_until_ms.expect("fenced");
    // Invariant::FenceFromLimits: the default limits, not the request's.
    assert_eq!(
        fenced,
        now + limits::DEFAULT_MAX_LEASE_MS + limits::DEFAULT_MAX_GRACE_MS
    );
}

#[test]
fn a_signed_position_of_an_earlier_incarnation_fences_a_registry_restored_to_it() {
    // DROP/CREATE EXTENSION (a new key), then a snapshot from before it
    // restored in place: the holder's newest token cannot verify there,
    // but what it saw of this incarnation before can (simulation seed 112,
    // KeptAsync, made IDs of one block on two servers before).
    let mut s = store_with(&["a"]);
    let snapshot = (s.tables.clone(), s.lsn);
    let reply = s
        .lease(100, &acquire("a", 1, Seen::default(), T0), T0)
        .unwrap();
    let block = reply.blocks[0].block;
    let before = seen_of(&reply.head);
    let newer = Seen {
        incarnation: "made-after-create".into(),
        lsn: format_lsn(s.lsn + 0x1000),
        grants: 0,
        token: "ab".repeat(16),
        earlier: vec![before.clone()],
    };
    s.tables = snapshot.0;
    s.lsn = snapshot.1;
    s.postmaster_start_ms += 1;
    // Past the fence a registry whose row was made anew gives any older
    // incarnation it hears of.
    let now = T0 + limits::DEFAULT_MAX_LEASE_MS + limits::DEFAULT_MAX_GRACE_MS + 1_000;
    // Of this incarnation, with a token it did not issue: no evidence.
    let forged = Seen {
        incarnation: before.incarnation.clone(),
        earlier: vec![Seen {
            token: "cd".repeat(16),
            ..before
        }],
        ..newer.clone()
    };
    let reply = s
        .lease(100, &renew("a", &[block], forged, now), now)
        .unwrap();
    assert_eq!(reply.head.fenced_until_ms, None, "a token it did not issue");
    let reply = s
        .lease(100, &renew("a", &[block], newer, now), now)
        .unwrap();
    let fenced = reply.head.fenced_until_ms.expect("fenced");
    assert_eq!(
        fenced,
        now + limits::DEFAULT_MAX_LEASE_MS + limits::DEFAULT_MAX_GRACE_MS
    );
}

#[test]
fn an_unsigned_position_counts_only_where_the_dba_lets_it() {
    // A holder before 0.8.0 sends no token: believed from a node with
    // blocks while unsigned_evidence is on (after an upgrade from 0.7.0).
    let mut s = store_with(&["a"]);
    s.set_limits(
        Some(LimitsRow {
            max_lease_ms: limits::DEFAULT_MAX_LEASE_MS,
            max_grace_ms: limits::DEFAULT_MAX_GRACE_MS,
            max_ahead_ms: limits::DEFAULT_MAX_AHEAD_MS,
            max_blocks_per_node: limits::DEFAULT_MAX_BLOCKS_PER_NODE,
            unsigned_evidence: true,
            ..LimitsRow::default()
        }),
        T0,
    );
    let reply = s
        .lease(100, &acquire("a", 1, Seen::default(), T0), T0)
        .unwrap();
    let seen = Seen {
        incarnation: reply.head.incarnation.clone(),
        lsn: format_lsn(s.lsn + 0x1000),
        grants: 0,
        token: String::new(),
        earlier: Vec::new(),
    };
    let reply = s
        .lease(100, &renew("a", &[reply.blocks[0].block], seen, T0), T0)
        .unwrap();
    assert!(reply.head.fenced_until_ms.is_some());
}

#[test]
fn a_release_never_lowers_a_mark_below_its_floor() {
    let mut s = store_with(&["a", "b"]);
    let r = s
        .lease(100, &acquire("a", 1, Seen::default(), T0), T0)
        .unwrap();
    let b = r.blocks[0].block;
    let seen = seen_of(&r.head);
    // a releases with a mark of 0 (a forged release).
    let rel = s.release(100, &release("a", b, 0, seen), T0 + 10).unwrap();
    assert!(rel.released);
    let row = s.tables.rows.blocks.iter().find(|r| r.block == b).unwrap();
    assert!(
        row.high_water_ms >= row.floor_ms,
        "{}",
        Invariant::ReleaseNotBelowFloor.name()
    );
}

#[test]
fn a_node_leases_no_more_than_its_limit() {
    let mut s = store_with(&["a"]);
    let r = s
        .lease(100, &acquire("a", 8, Seen::default(), T0), T0)
        .unwrap();
    assert_eq!(r.blocks.len(), 8);
    let refused = s
        .lease(100, &acquire("a", 1, seen_of(&r.head), T0), T0)
        .unwrap_err();
    assert_eq!(refused.code, SqlState::ProgramLimitExceeded);
}

#[test]
fn a_block_holding_a_set_aside_id_is_never_leased_nor_counted_free() {
    // 1020-1023 set aside: block 63 (1008-1023) is never leased; 63 others,
    // one each to nodes that hold none (the reserve goes to them too).
    let nodes: Vec<String> = (0..70).map(|i| format!("n{i}")).collect();
    let names: Vec<&str> = nodes.iter().map(String::as_str).collect();
    let mut s = store_with(&names);
    s.backfill_ids = "1020-1023".into();
    let mut leased = Vec::new();
    for (i, n) in names.iter().enumerate() {
        if let Ok(r) = s.lease(100 + i as u64, &acquire(n, 1, Seen::default(), T0), T0) {
            leased.extend(r.blocks.iter().map(|b| b.block));
        }
    }
    assert!(!leased.contains(&63), "{leased:?}");
    assert_eq!(leased.len(), 63, "{leased:?}");
    // A node that may use block 63 only gets nothing, even the first.
    let mut s = store_with(&["a"]);
    s.backfill_ids = "1020-1023".into();
    let Call::Acquire(mut only) = acquire("a", 1, Seen::default(), T0) else {
        unreachable!()
    };
    only.allowed = vec![63];
    let r = s.lease(100, &Call::Acquire(only), T0).unwrap();
    assert!(r.blocks.is_empty(), "{:?}", r.blocks);
}

#[test]
fn the_last_free_blocks_go_only_to_servers_that_hold_none() {
    // 0.7.0: eight sessions of the lease role, each a made-up node with
    // max_blocks_per_node blocks, held 63 of 64 and a new server got none.
    let intruders: Vec<String> = (0..8).map(|i| format!("intruder{i}")).collect();
    let mut nodes: Vec<&str> = vec!["a"];
    nodes.extend(intruders.iter().map(String::as_str));
    nodes.push("b");
    let mut s = store_with(&nodes);
    s.lease(100, &acquire("a", 1, Seen::default(), T0), T0)
        .unwrap();
    let reserve = limits::DEFAULT_RESERVE_BLOCKS;
    let mut taken = 0;
    for (i, x) in intruders.iter().enumerate() {
        let pid = 101 + i as u64;
        // One block at a time, as the attack did, until refused or none.
        for _ in 0..8 {
            match s.lease(pid, &acquire(x, 1, Seen::default(), T0), T0) {
                Ok(r) if !r.blocks.is_empty() => taken += r.blocks.len(),
                _ => break,
            }
        }
    }
    let held = |s: &Store| s.tables.rows.blocks.iter().filter(|b| !b.free(T0)).count() as i64;
    // Above the reserve every node took what it asked; within it, one
    // block for each node that held none.
    assert_eq!(held(&s), 64 - reserve + 1, "{taken} taken by the intruders");
    let r = s
        .lease(109, &acquire("b", 2, Seen::default(), T0), T0)
        .unwrap();
    assert_eq!(
        r.blocks.len(),
        1,
        "a new server gets one block of the reserve"
    );
    // A node that holds blocks gets none of the reserve.
    let r = s.lease(101, &acquire("intruder0", 1, Seen::default(), T0), T0);
    assert!(r.is_err_and(|e| e.code == SqlState::ProgramLimitExceeded));
    let r = s
        .lease(108, &acquire("intruder7", 1, Seen::default(), T0), T0)
        .unwrap();
    assert!(r.blocks.is_empty());
}

proptest! {
    /// The reserve over any sequence of acquires of ten nodes: a node that
    /// holds blocks never takes one of the last `reserve_blocks` free, and
    /// a node that holds none takes one at most.
    #[test]
    fn the_reserve_is_kept_for_nodes_that_hold_none(
        steps in proptest::collection::vec((0..10usize, 1..9i64, 0..3_000i64), 1..60),
        reserve in 0..20i64,
    ) {
        let names: Vec<String> = (0..10).map(|i| format!("n{i}")).collect();
        let nodes: Vec<&str> = names.iter().map(String::as_str).collect();
        let mut s = store_with(&nodes);
        s.set_limits(Some(LimitsRow {
            max_lease_ms: limits::DEFAULT_MAX_LEASE_MS,
            max_grace_ms: limits::DEFAULT_MAX_GRACE_MS,
            max_ahead_ms: limits::DEFAULT_MAX_AHEAD_MS,
            max_blocks_per_node: 16,
            reserve_blocks: Some(reserve),
            ..LimitsRow::default()
        }), T0);
        let mut now = T0;
        for (node, want, advance) in steps {
            now += advance;
            let free = |s: &Store| 64 - s.tables.rows.blocks.iter().filter(|b| !b.free(now)).count() as i64;
            let before = free(&s);
            let held = s.tables.rows.blocks.iter().any(|b| b.held_by(nodes[node], now));
            let Ok(r) = s.lease(100 + node as u64, &acquire(nodes[node], want, Seen::default(), now), now) else {
                continue;
            };
            let got = r.blocks.len() as i64;
            prop_assert_eq!(free(&s), before - got);
            if held {
                prop_assert!(got == 0 || free(&s) >= reserve, "a node holding blocks took the reserve: {} free of {} before", free(&s), before);
            } else {
                prop_assert!(free(&s) >= reserve || got <= 1, "a new node took {} blocks of the reserve", got);
                prop_assert!(got >= 1 || before == 0, "a new node got nothing with {} free", before);
            }
        }
    }
}

#[test]
fn the_reserve_follows_the_limits_and_the_layouts_blocks() {
    let mut s = store_with(&["a", "b"]);
    let limits = |reserve: i64| LimitsRow {
        max_lease_ms: limits::DEFAULT_MAX_LEASE_MS,
        max_grace_ms: limits::DEFAULT_MAX_GRACE_MS,
        max_ahead_ms: limits::DEFAULT_MAX_AHEAD_MS,
        max_blocks_per_node: 64,
        reserve_blocks: Some(reserve),
        ..LimitsRow::default()
    };
    // 0: every block may go to one node.
    s.set_limits(Some(limits(0)), T0);
    let r = s
        .lease(100, &acquire("a", 64, Seen::default(), T0), T0)
        .unwrap();
    assert_eq!(r.blocks.len(), 64);
    // A layout of 8 blocks (max_worker_id 7, a block of 1 id) and a
    // reserve of 8: each node gets its first block only.
    let mut s = store_with(&["a", "b"]);
    s.set_limits(Some(limits(8)), T0);
    let small = |node: &str, want: i64| {
        let mut c = acquire(node, want, Seen::default(), T0);
        if let Call::Acquire(r) = &mut c {
            r.block_size = 1;
            r.max_worker_id = 7;
            r.layout = "small".into();
        }
        c
    };
    s.layout = Some("small".into());
    assert_eq!(s.lease(100, &small("a", 4), T0).unwrap().blocks.len(), 1);
    assert_eq!(s.lease(100, &small("a", 4), T0).unwrap().blocks.len(), 0);
    assert_eq!(s.lease(101, &small("b", 4), T0).unwrap().blocks.len(), 1);
    // Blocks whose lease and grace ran out are free again.
    let later = T0 + LEASE + GRACE + 1;
    assert_eq!(
        limits::in_force(s.tables.rows.limits.as_ref(), later).reserve_blocks,
        8
    );
    let r = s.lease(100, &small("a", 1), later);
    assert!(r.is_ok_and(|r| r.blocks.len() == 1));
    // Out of range in a row written by hand: kept in range.
    assert_eq!(
        limits::in_force(Some(&limits(1_000)), T0).reserve_blocks,
        limits::RESERVE_RANGE.1
    );
}

#[test]
fn a_request_cannot_fix_the_layout_for_others() {
    // 0.7.0: one acquire with "layout": "not a layout" made all 64 rows
    // under it and every real holder was refused.
    let mut s = store_with(&["hostile", "a"]);
    let mut req = acquire("hostile", 1, Seen::default(), T0);
    if let Call::Acquire(r) = &mut req {
        r.layout = "not a layout".into();
    }
    // The registry's own layout decides on a registry with no rows.
    let refused = s.lease(100, &req, T0).unwrap_err();
    assert_eq!(refused.code, SqlState::NotInPrerequisiteState);
    assert!(s.tables.rows.blocks.is_empty());
    // Where the registry's layout is not known, rows are made only for
    // the blocks granted, and the DBA fixes the fleet's layout: the free
    // rows follow it.
    s.layout = None;
    s.lease(100, &req, T0).unwrap();
    assert_eq!(
        s.tables.rows.blocks.len(),
        1,
        "rows only for the blocks granted"
    );
    // The DBA fixes the fleet's layout: the free rows follow it.
    s.set_limits(
        Some(LimitsRow {
            max_lease_ms: limits::DEFAULT_MAX_LEASE_MS,
            max_grace_ms: limits::DEFAULT_MAX_GRACE_MS,
            max_ahead_ms: limits::DEFAULT_MAX_AHEAD_MS,
            max_blocks_per_node: limits::DEFAULT_MAX_BLOCKS_PER_NODE,
            layout: Some("classic".into()),
            ..LimitsRow::default()
        }),
        T0,
    );
    let r = s
        .lease(101, &acquire("a", 1, Seen::default(), T0), T0)
        .unwrap();
    assert_eq!(r.blocks.len(), 1);
}

#[test]
fn synchronous_standby_names_is_read_as_postgresql_does() {
    for (names, n) in [
        ("", 0),
        ("s1", 1),
        ("s1, s2", 1),
        ("*", 1),
        ("FIRST 2 (s1, s2, s3)", 2),
        ("first 2 (s1, s2)", 2),
        ("ANY 3 (a,b,c)", 3),
        ("2 (s1, s2)", 2),
        ("first", 1),
    ] {
        assert_eq!(durable::needed(names), n, "{names}");
    }
}

fn standby(name: &str, flush: u64, reply_ms: i64) -> Standby {
    Standby {
        application_name: name.into(),
        sync_state: "sync".into(),
        flush_lsn: Some(flush),
        physical: true,
        streaming: true,
        reply_time_ms: Some(reply_ms),
    }
}

#[test]
fn the_names_of_synchronous_standby_names_are_read_as_postgresql_does() {
    let names = |s: &str| durable::listed_names(s);
    let plain = |v: &[&str]| -> Vec<(String, bool)> {
        v.iter().map(|n| ((*n).to_string(), false)).collect()
    };
    assert_eq!(names("s1"), plain(&["s1"]));
    assert_eq!(names("s1, s2"), plain(&["s1", "s2"]));
    assert_eq!(names("FIRST 1 (s1, s2)"), plain(&["s1", "s2"]));
    assert_eq!(names("any 2 (*)"), plain(&["*"]));
    assert_eq!(names("2 (a,b)"), plain(&["a", "b"]));
    // Quoted: commas and parentheses are the name's, "" a quote.
    assert_eq!(
        names(r#"FIRST 1 ("a,b", "c(d)", "e""f", "*")"#),
        vec![
            ("a,b".to_string(), true),
            ("c(d)".to_string(), true),
            ("e\"f".to_string(), true),
            ("*".to_string(), true),
        ]
    );
    // A name that begins as a keyword does.
    assert_eq!(names("anyone, firstly"), plain(&["anyone", "firstly"]));
}

#[test]
fn a_standby_whose_clock_strays_never_becomes_a_candidate() {
    // 0.7.0: s1's clock 60 s behind let it prove, after it was dropped,
    // that it had every durable grant (547,254 duplicate IDs).
    let facts = durable::Facts {
        now_ms: T0,
        synchronous_standby_names: "FIRST 1 (s1, s2)".into(),
        target: 0x500,
        timeline: 1,
        incarnation_here: true,
        standbys: vec![standby("s1", 0x500, T0 - 60_000), standby("s2", 0x500, T0)],
        candidates: Some(CandidatesRow {
            members: vec![],
            valid_until_ms: i64::MIN,
            timeline: 1,
            updated_at_ms: T0,
        }),
        me: String::new(),
        kept: None,
    };
    let d = durable::decide(&facts);
    assert!(d.reply.durable);
    assert_eq!(d.write.map(|w| w.members), Some(vec!["s2".to_string()]));
}

#[test]
fn a_candidate_behind_holds_durability_back_until_dropped() {
    let row = CandidatesRow {
        members: vec!["s1".into(), "s2".into()],
        valid_until_ms: T0 + 10_000,
        timeline: 1,
        updated_at_ms: T0,
    };
    let mut facts = durable::Facts {
        now_ms: T0,
        synchronous_standby_names: "ANY 1 (s1, s2)".into(),
        target: 0x500,
        timeline: 1,
        incarnation_here: true,
        standbys: vec![standby("s1", 0x400, T0), standby("s2", 0x500, T0)],
        candidates: Some(row.clone()),
        me: String::new(),
        kept: None,
    };
    let d = durable::decide(&facts);
    assert!(!d.reply.durable);
    assert_eq!(d.reply.behind, vec!["s1".to_string()]);
    facts.now_ms = row.valid_until_ms + durable::DROP_MARGIN_MS + 1;
    facts.standbys[1].reply_time_ms = Some(facts.now_ms);
    let d = durable::decide(&facts);
    assert!(d.reply.durable);
    let w = d.write.expect("dropped");
    assert_eq!(w.members, vec!["s2".to_string()]);
    // valid_until never moves back.
    assert!(w.valid_until_ms >= row.valid_until_ms);
}

#[test]
fn a_row_made_anew_under_a_star_holds_durability_back_until_it_expires() {
    // s1 was cut off before CREATE EXTENSION: gone from pg_stat_replication,
    // it may still hold the dropped registry's row naming it (86,287
    // duplicate IDs on PostgreSQL 15 when the row counted s2 alone).
    let row = CandidatesRow {
        members: vec![durable::EVERY_STANDBY.into()],
        valid_until_ms: T0 + durable::CANDIDATE_TTL_MS,
        timeline: 1,
        updated_at_ms: T0,
    };
    let mut facts = durable::Facts {
        now_ms: T0 + 1_000,
        synchronous_standby_names: "ANY 1 (*)".into(),
        target: 0x500,
        timeline: 1,
        incarnation_here: true,
        standbys: vec![standby("s2", 0x500, T0 + 1_000)],
        candidates: Some(row.clone()),
        me: String::new(),
        kept: None,
    };
    let d = durable::decide(&facts);
    assert!(!d.reply.durable);
    assert_eq!(d.reply.behind, vec![durable::EVERY_STANDBY.to_string()]);
    assert_eq!(d.write, None);
    // Waiting for the standbys would not help.
    assert!(durable::progress(&facts).done);
    facts.now_ms = row.valid_until_ms + durable::DROP_MARGIN_MS + 1;
    facts.standbys[0].reply_time_ms = Some(facts.now_ms);
    let d = durable::decide(&facts);
    assert!(d.reply.durable);
    let w = d.write.expect("named");
    assert_eq!(w.members, vec!["s2".to_string()]);
    // Once the row names its standbys, it holds nothing back.
    facts.candidates = Some(w);
    assert!(durable::decide(&facts).reply.durable);
    // A plain '*' as well. A standby named "*" (quoted) is a name, held
    // back for as a listed standby that does not stream: waited for.
    for (names, waited) in [
        ("*", false),
        ("FIRST 1 (s2, *)", false),
        ("ANY 1 (\"*\")", true),
    ] {
        facts.synchronous_standby_names = names.into();
        facts.candidates = Some(row.clone());
        facts.now_ms = T0 + 1_000;
        facts.standbys[0].reply_time_ms = Some(facts.now_ms);
        assert!(!durable::decide(&facts).reply.durable, "{names}");
        assert_eq!(!durable::progress(&facts).done, waited, "{names}");
    }
}

#[test]
fn a_row_made_anew_names_the_members_of_the_last_row_this_server_wrote() {
    // tests/fleet/test_adversarial_s19.py: s1 cut off, taken out of
    // `ANY 1 (s1, s2)`, then DROP and CREATE EXTENSION; s1, promoted, proved
    // itself by the dropped registry's row naming it (39,682 IDs made
    // twice). The row made anew names s1 again, behind, until it is
    // dropped.
    let mut s = Store::created(T0, 7);
    s.synchronous_standby_names = "ANY 1 (s1, s2)".into();
    let both = [standby("s1", u64::MAX, T0), standby("s2", u64::MAX, T0)];
    assert!(s.durable(T0, s.lsn, &both).durable);
    let last = s.tables.candidates.clone().unwrap();
    assert_eq!(last.members, vec!["s1".to_string(), "s2".to_string()]);
    assert_eq!(s.data_candidates.as_ref(), Some(&last));
    // s1 is cut off and taken out of the setting; the extension is made
    // again.
    s.synchronous_standby_names = "ANY 1 (s2)".into();
    let t = T0 + 2_000;
    s.create_extension(t);
    let anew = s.tables.candidates.clone().unwrap();
    assert_eq!(anew.members, last.members);
    assert_eq!(anew.valid_until_ms, last.valid_until_ms);
    let s2 = [standby("s2", u64::MAX, t)];
    let d = s.durable(t, s.lsn, &s2);
    assert!(!d.durable, "{d:?}");
    assert_eq!(d.behind, vec!["s1".to_string()]);
    // Dropped after its valid_until and the margin: durable on s2 alone.
    let t = last.valid_until_ms + durable::DROP_MARGIN_MS + 1;
    let s2 = [standby("s2", u64::MAX, t)];
    assert!(s.durable(t, s.lsn, &s2).durable);
    assert_eq!(s.tables.candidates.unwrap().members, vec!["s2".to_string()]);
    // A row of another timeline (a promoted server's copy of the file)
    // names every standby that may be synchronous.
    let other = durable::made_anew(Some(&last), 2, t);
    assert_eq!(other.members, vec![durable::EVERY_STANDBY.to_string()]);
    assert_eq!(durable::made_anew(None, 1, t).members, other.members);
}

#[test]
fn a_promotion_is_proven_only_before_valid_until_by_its_own_clock() {
    let mut server = Server {
        now_ms: T0,
        timeline: 2,
        proof: Proof {
            standby_name: "s1".into(),
            candidates: Some(CandidatesRow {
                members: vec!["s1".into()],
                valid_until_ms: T0 + 1,
                timeline: 1,
                updated_at_ms: T0,
            }),
            history: Some((1, "0/5000".into(), "no recovery target specified".into())),
        },
        ..Server::default()
    };
    assert!(begin::promotion_proven(&server, 1).is_some());
    server.now_ms = T0 + 1;
    assert!(begin::promotion_proven(&server, 1).is_none());
    server.now_ms = T0;
    server.proof.history = Some((1, "0/5000".into(), "at restore point".into()));
    assert!(begin::promotion_proven(&server, 1).is_none());
    server.proof.history = Some((1, "0/5000".into(), "no recovery target specified".into()));
    server.proof.standby_name = "s2".into();
    assert!(begin::promotion_proven(&server, 1).is_none());
}

/// One step of a random sequence of calls.
#[derive(Clone, Debug)]
enum Step {
    Acquire {
        node: usize,
        want: i64,
    },
    Renew {
        node: usize,
    },
    Release {
        node: usize,
        pick: usize,
        back_ms: i64,
    },
    Advance {
        ms: i64,
    },
    Reconnect {
        node: usize,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (0..3usize, 1..4i64).prop_map(|(node, want)| Step::Acquire { node, want }),
        (0..3usize).prop_map(|node| Step::Renew { node }),
        (0..3usize, 0..8usize, 0..20_000i64).prop_map(|(node, pick, back_ms)| Step::Release {
            node,
            pick,
            back_ms
        }),
        (1..9_000i64).prop_map(|ms| Step::Advance { ms }),
        (0..3usize).prop_map(|node| Step::Reconnect { node }),
    ]
}

proptest! {
    /// Invariant::DisjointBlocks, MarkRisesWhileHeld, ReleaseNotBelowFloor
    /// over any sequence of calls of three nodes, whose sessions come and go.
    #[test]
    fn the_rows_keep_the_invariants(steps in proptest::collection::vec(step(), 1..80)) {
        let nodes = ["a", "b", "c"];
        let mut s = store_with(&nodes);
        let mut pids = [100u64, 101, 102];
        let mut seen: Vec<Seen> = vec![Seen::default(); 3];
        let mut now = T0;
        let mut next_pid = 200;
        for st in steps {
            let before = s.tables.rows.blocks.clone();
            match st {
                Step::Advance { ms } => { now += ms; continue; }
                Step::Reconnect { node } => {
                    s.disconnect(pids[node]);
                    pids[node] = s.connect(next_pid, now);
                    next_pid += 1;
                    prop_assert_eq!(s.hello(pids[node], nodes[node]), Ok(true));
                    continue;
                }
                Step::Acquire { node, want } => {
                    if let Ok(r) = s.lease(pids[node], &acquire(nodes[node], want, seen[node].clone(), now), now) {
                        seen[node] = seen_of(&r.head);
                        for f in &r.blocks {
                            let old = before.iter().find(|b| b.block == f.block);
                            // Invariant::DisjointBlocks: only a free block goes.
                            prop_assert!(old.is_none_or(|o| o.free(now)), "block {} was not free", f.block);
                            prop_assert_eq!(f.floor_ms, old.map_or(0, |o| o.high_water_ms));
                        }
                    }
                }
                Step::Renew { node } => {
                    let mine: Vec<u32> = before.iter().filter(|b| b.holder_node.as_deref() == Some(nodes[node])).map(|b| b.block).collect();
                    if let Ok(r) = s.lease(pids[node], &renew(nodes[node], &mine, seen[node].clone(), now), now) {
                        seen[node] = seen_of(&r.head);
                    }
                }
                Step::Release { node, pick, back_ms } => {
                    let mine: Vec<&BlockRow> = before.iter().filter(|b| b.holder_node.as_deref() == Some(nodes[node])).collect();
                    if let Some(b) = mine.get(pick % mine.len().max(1)) {
                        let call = release(nodes[node], b.block, now - back_ms, seen[node].clone());
                        if let Ok(r) = s.release(pids[node], &call, now) {
                            seen[node] = seen_of(&r.head);
                        }
                    }
                }
            }
            for after in &s.tables.rows.blocks {
                let Some(old) = before.iter().find(|b| b.block == after.block) else { continue };
                if old.holder_node.is_some() && old.holder_node == after.holder_node && old.holder_session == after.holder_session {
                    prop_assert!(after.high_water_ms >= old.high_water_ms, "{:?}", Invariant::MarkRisesWhileHeld);
                }
                if after.holder_node.is_none() && old.holder_node.is_some() {
                    prop_assert!(after.high_water_ms >= old.floor_ms, "{:?}", Invariant::ReleaseNotBelowFloor);
                }
                if old.holder_node.is_some() && after.holder_node != old.holder_node && after.holder_node.is_some() {
                    prop_assert!(old.free(now), "{:?}: block {} handed over early", Invariant::DisjointBlocks, after.block);
                }
            }
        }
    }
}

#[test]
fn a_lease_role_holding_blocks_cannot_fence_with_unsigned_claims() {
    // Found by the simulation: with unsigned claims counted from any node
    // holding blocks, a lease role that leased one fenced the fleet every
    // few seconds.
    let mut s = store_with(&["rogue"]);
    let r = s
        .lease(100, &acquire("rogue", 1, Seen::default(), T0), T0)
        .unwrap();
    let first = r.head.incarnation.clone();
    for (incarnation, lsn) in [
        (first.as_str(), "FFFFFFFF/FFFFFFFF"),
        ("never-issued", "0/0"),
    ] {
        let forged = Seen {
            incarnation: incarnation.into(),
            lsn: lsn.into(),
            grants: 0,
            token: String::new(),
            earlier: Vec::new(),
        };
        let reply = s
            .lease(100, &renew("rogue", &[r.blocks[0].block], forged, T0), T0)
            .unwrap();
        assert_eq!(reply.head.incarnation, first);
        assert_eq!(reply.head.fenced_until_ms, None);
    }
}

#[test]
fn a_count_this_postmaster_signed_is_no_evidence() {
    // A lease call's reply can leave before its transaction rolls back (a
    // DO block that shows it, then raises): its signed count was never
    // committed. Without a restart, presenting it fenced the registry at
    // will (16 fences in 30 s on real servers).
    let mut s = store_with(&["a"]);
    let snapshot = s.tables.clone();
    let r = s
        .lease(100, &acquire("a", 1, Seen::default(), T0), T0)
        .unwrap();
    // The grant rolled back: its rows are as before, its WAL written.
    s.roll_back(snapshot);
    let reply = s
        .lease(100, &renew("a", &[], seen_of(&r.head), T0), T0)
        .unwrap();
    assert_eq!(reply.head.fenced_until_ms, None, "{reply:?}");
}

#[test]
fn a_count_shown_again_after_its_fence_fences_no_more() {
    // tests/fleet/test_adversarial_s23.py: a reply whose call rolled back,
    // shown after a restart (the signed count is gone), fences, as a
    // registry restored in place must; shown again after that fence it
    // fenced again at every call (30 fences in 15 s), a fenced row
    // keeping its own count. The fence counts the grants it answered.
    let mut s = store_with(&["a"]);
    let snapshot = s.tables.clone();
    let r = s
        .lease(100, &acquire("a", 1, Seen::default(), T0), T0)
        .unwrap();
    s.tables = snapshot;
    s.postmaster_start_ms += 1;
    let first = s
        .lease(100, &renew("a", &[], seen_of(&r.head), T0), T0)
        .unwrap();
    assert_eq!(first.head.fenced_until_ms, Some(T0 + FENCE), "{first:?}");
    for later in [T0 + 1_000, T0 + FENCE + 1_000] {
        let again = s
            .lease(100, &renew("a", &[], seen_of(&r.head), later), later)
            .unwrap();
        assert_eq!(again.head.incarnation, first.head.incarnation, "{again:?}");
    }
}

#[test]
fn a_registry_restored_in_place_is_caught_by_its_grant_count() {
    // 0.7.0: a snapshot restored in place whose WAL then passed every
    // position its holders saw was not detected (71,102 duplicate IDs).
    let mut s = store_with(&["a"]);
    let snapshot = s.tables.clone();
    let r = s
        .lease(100, &acquire("a", 1, Seen::default(), T0), T0)
        .unwrap();
    assert_eq!(r.head.grants, 1);
    s.tables = snapshot;
    s.lsn += 0x1000_0000;
    // Restored, so restarted: it signed none of what the holder saw.
    s.postmaster_start_ms += 1;
    let reply = s
        .lease(
            100,
            &renew("a", &[r.blocks[0].block], seen_of(&r.head), T0),
            T0,
        )
        .unwrap();
    assert!(reply.head.fenced_until_ms.is_some(), "{reply:?}");
}

/// A fence after `now`: the limits' lease and grace.
const FENCE: i64 = limits::DEFAULT_MAX_LEASE_MS + limits::DEFAULT_MAX_GRACE_MS;
/// How long after a restart a grant forgotten by it can still repeat IDs
/// (`begin::forgotten_matters_until`): its IDs run up to the limits' lead
/// of a mark ahead of the registry's clock, plus grace.
const MARKS_PASSED: i64 = limits::DEFAULT_MAX_AHEAD_MS + limits::DEFAULT_MAX_GRACE_MS;
const _: () = assert!(
    MARKS_PASSED > FENCE,
    "the defaults let marks lead past a fence"
);

/// A registry whose row was made anew (`DROP`/`CREATE EXTENSION` while
/// holder "a" held block locks, then a's call fenced it), and a snapshot
/// from before: the store, the snapshot, a's block, what a saw last and
/// when (after the fence).
fn made_anew_after_a_snapshot() -> (Store, (memory::Tables, u64), u32, Seen, i64) {
    let mut s = store_with(&["a"]);
    let r = s
        .lease(100, &acquire("a", 1, Seen::default(), T0), T0)
        .unwrap();
    let block = r.blocks[0].block;
    // More grants before the snapshot than a sees after it: its count is
    // past the restored registry's in neither.
    for i in 1..4 {
        let t = T0 + i * 10;
        s.lease(100, &acquire("a", 1, seen_of(&r.head), t), t)
            .unwrap();
    }
    let snapshot = (s.tables.clone(), s.lsn);
    let before = incarnation(&s);
    s.create_extension(T0 + 1_000);
    assert!(s.tables.rows.registry.is_none(), "live block locks: no row");
    let t = T0 + 2_000;
    let r = s
        .lease(100, &renew("a", &[block], seen_of(&r.head), t), t)
        .unwrap();
    assert!(r.head.fenced_until_ms.is_some(), "{r:?}");
    let row = s.tables.rows.registry.clone().unwrap();
    assert_eq!(row.history, vec![before], "the verified incarnation a knew");
    let t = t + FENCE + 1_000;
    let r = s
        .lease(100, &renew("a", &[block], seen_of(&r.head), t), t)
        .unwrap();
    // A row made anew goes on from the count before it, so a's count is
    // past the snapshot's, which fences too (GrantsBack). For the rule on
    // the incarnation alone, the snapshot's count as high as a saw (as
    // more grants before it would make it).
    let mut snapshot = snapshot;
    if let Some(row) = snapshot.0.rows.registry.as_mut() {
        row.grants = row.grants.max(r.head.grants);
    }
    (s, snapshot, block, seen_of(&r.head), t)
}

#[test]
fn a_registry_restored_to_before_its_row_was_made_anew_fences_on_an_incarnation_it_never_had() {
    // tests/fleet/test_adversarial_s17.py, none_between: no grant between
    // the snapshot and DROP EXTENSION, and the restored registry's WAL past
    // every position a holder saw. Only the incarnation a knows tells.
    let (mut s, snapshot, block, seen, t) = made_anew_after_a_snapshot();
    let have = snapshot.0.rows.registry.as_ref().map_or(0, |r| r.grants);
    assert!(seen.grants <= have, "{} > {have}", seen.grants);
    let now = t + 20_000;
    s.tables = snapshot.0;
    s.lsn += 0x1000_0000;
    s.postmaster_start_ms = now;
    let r = s
        .lease(100, &renew("a", &[block], seen.clone(), now), now)
        .unwrap();
    assert_eq!(r.head.fenced_until_ms, Some(now + FENCE), "{r:?}");
    let row = s.tables.rows.registry.clone().unwrap();
    assert!(row.cause.contains("never had"), "{}", row.cause);
    assert!(row.had(&seen.incarnation), "{row:?}");
    // Known now: a second holder of it fences nothing more.
    s.connect(101, now);
    assert_eq!(s.hello(101, "b"), Ok(true));
    let later = now + FENCE + 1_000;
    let b = Seen {
        earlier: Vec::new(),
        ..seen
    };
    let r = s.lease(101, &acquire("b", 1, b, later), later).unwrap();
    assert_eq!(r.head.fenced_until_ms, None, "{r:?}");
    assert_eq!(r.head.incarnation, row.incarnation);
}

#[test]
fn an_incarnation_never_had_is_no_evidence_a_fence_after_the_start_or_unsigned() {
    let (s, snapshot, block, seen, t) = made_anew_after_a_snapshot();
    let restore = |s: &Store, start: i64| {
        let mut s = s.clone();
        s.tables = snapshot.0.clone();
        s.lsn += 0x1000_0000;
        s.postmaster_start_ms = start;
        s
    };
    // Every grant made before the start has run out a fence after it, and
    // its IDs (up to max_ahead_ms ahead of the registry's clock) are below
    // every clock a grace after that lead.
    let start = t + 20_000;
    let now = start + MARKS_PASSED + 1;
    let mut late = restore(&s, start);
    let r = late
        .lease(100, &renew("a", &[block], seen.clone(), now), now)
        .unwrap();
    assert_eq!(r.head.fenced_until_ms, None, "{r:?}");
    // A token the registry did not issue, soon after the start (and past
    // the window in which the restored row, made with its key, counts any
    // older incarnation once).
    let start = T0 + MARKS_PASSED + 1;
    let mut forged = restore(&s, start);
    let unsigned = Seen {
        token: "ab".repeat(16),
        ..seen.clone()
    };
    let r = forged
        .lease(100, &renew("a", &[block], unsigned, start), start)
        .unwrap();
    assert_eq!(r.head.fenced_until_ms, None, "{r:?}");
}

#[test]
fn an_older_incarnation_fences_past_the_fence_while_forgotten_ids_may_be_ahead() {
    // The extension made again while no holder's session was alive (no
    // block locks): the new row starts unfenced. A holder of the older
    // incarnation calling a fence later still fences, until its IDs (up to
    // the limits' lead ahead of the registry's clock) are below every
    // clock: its block rows are gone, so nothing else keeps a new lease
    // of its block above them.
    // Long after its postmaster started: no restore.
    let mut s = Store::created(T0 - 10 * MARKS_PASSED, 7);
    s.connect(100, T0);
    assert_eq!(s.hello(100, "a"), Ok(true));
    let r = s
        .lease(100, &acquire("a", 1, Seen::default(), T0), T0)
        .unwrap();
    let block = r.blocks[0].block;
    s.sessions.clear();
    let made = T0 + 1_000;
    s.create_extension(made);
    assert_eq!(
        s.tables.rows.registry.as_ref().unwrap().fenced_until_ms,
        None
    );
    s.connect(101, made);
    assert_eq!(s.hello(101, "a"), Ok(true));
    let now = made + FENCE + 1;
    let r = s
        .lease(101, &renew("a", &[block], seen_of(&r.head), now), now)
        .unwrap();
    let row = s.tables.rows.registry.clone().unwrap();
    assert!(r.head.fenced_until_ms.is_some(), "{r:?} {}", row.cause);
    assert!(
        row.cause.contains("knew incarnation") && !row.cause.contains("never had"),
        "{}",
        row.cause
    );
}

#[test]
fn an_incarnation_never_had_fences_past_the_fence_while_forgotten_ids_may_be_ahead() {
    // tests/fleet/test_adversarial_s19.py: every holder away from the
    // restored registry for a fence after its start. The forgotten grant
    // ran out, but its IDs ran up to max_drift ahead of its holder's clock
    // (60 s; the default limits let marks lead by 12 min): a block leased
    // anew above the restored mark repeats them. Until a grace past the
    // lead, the incarnation never had still fences, and raises the marks.
    let (s, snapshot, block, seen, t) = made_anew_after_a_snapshot();
    let mut s = s;
    s.tables = snapshot.0;
    s.lsn += 0x1000_0000;
    let start = t + 20_000;
    s.postmaster_start_ms = start;
    let now = start + FENCE + 1;
    let r = s.lease(100, &renew("a", &[block], seen, now), now).unwrap();
    assert_eq!(r.head.fenced_until_ms, Some(now + FENCE), "{r:?}");
    let floor = s
        .tables
        .rows
        .blocks
        .iter()
        .find(|b| b.block == block)
        .map(|b| b.high_water_ms);
    assert!(floor >= Some(now + MARKS_PASSED), "{floor:?}");
}

#[test]
fn a_restart_fences_no_holder_of_an_incarnation_the_row_had() {
    // The incarnations before (in history) are known: a holder that slept
    // through them calls soon after a restart, long after they ended.
    let (mut s, _, block, seen, t) = made_anew_after_a_snapshot();
    let row = s.tables.rows.registry.clone().unwrap();
    let older = Seen {
        incarnation: row.history[0].clone(),
        ..seen
    };
    let now = t + 60_000;
    s.postmaster_start_ms = now - 1_000;
    let r = s
        .lease(100, &renew("a", &[block], older, now), now)
        .unwrap();
    assert_eq!(r.head.fenced_until_ms, None, "{r:?}");
    assert_eq!(r.head.incarnation, row.incarnation);
}

#[test]
fn a_copy_of_the_registrys_database_put_in_its_place_fences() {
    // tests/fleet/test_adversarial_s19.py: the copy put back 90 s after the
    // postmaster started, with and without the extension made again in
    // between (68,701 IDs made twice on PostgreSQL 15). No restart, and the
    // WAL moved on: only the row's database tells.
    for made_again in [false, true] {
        let mut s = store_with(&["a"]);
        let t = T0 + 1_000;
        let r = s
            .lease(100, &acquire("a", 1, Seen::default(), t), t)
            .unwrap();
        let copy = s.tables.clone();
        let t = t + 1_000;
        if made_again {
            s.sessions.clear();
            s.create_extension(t);
            s.connect(100, t);
            assert_eq!(s.hello(100, "a"), Ok(true));
        }
        let r = s
            .lease(100, &acquire("a", 2, seen_of(&r.head), t), t)
            .unwrap();
        let now = T0 + 90_000 + FENCE + MARKS_PASSED;
        s.put_back_copy(&copy);
        s.connect(101, now);
        assert_eq!(s.hello(101, "b"), Ok(true));
        let reply = s.lease(101, &acquire("b", 1, Seen::default(), now), now);
        let r2 = reply.unwrap();
        assert_eq!(
            r2.head.fenced_until_ms,
            Some(now + FENCE),
            "{made_again}: {r2:?}"
        );
        let row = s.tables.rows.registry.clone().unwrap();
        assert!(row.cause.contains("copy of the database"), "{}", row.cause);
        assert_eq!(row.database_oid, Some(s.database_oid));
        // Written in this database now. A holder that saw a grant the copy
        // lacks (seen above the copy's count) fences once more: the registry cannot tell whether that
        // grant came before the copy's fence began or after it, made by the
        // original still serving (tests/fleet/test_adversarial_s22.py: not
        // fencing it made 104,255 IDs twice). Then nothing more.
        s.connect(102, now);
        assert_eq!(s.hello(102, "a"), Ok(true));
        let later = now + FENCE + 1_000;
        let r3 = s
            .lease(102, &renew("a", &[], seen_of(&r.head), later), later)
            .unwrap();
        if r3.head.incarnation != row.incarnation {
            assert_eq!(r3.head.fenced_until_ms, Some(later + FENCE), "{r3:?}");
        }
        let again = later + FENCE + 1_000;
        let r4 = s
            .lease(102, &renew("a", &[], seen_of(&r3.head), again), again)
            .unwrap();
        assert_eq!(r4.head.incarnation, r3.head.incarnation, "{r4:?}");
    }
}

#[test]
fn the_original_put_back_after_its_copy_served_fences() {
    // tests/fleet/test_adversarial_s21.py: the copy served (fenced, then
    // granting), the original was put back 90 s after the postmaster
    // started: its row names its own database, and the holders' grant
    // count was at or below the postmaster's signed count, which the
    // copy's grants had raised: 94,958 IDs made twice on PostgreSQL 15.
    // The signed count is kept per database.
    let mut s = store_with(&["a"]);
    let t = T0 + 1_000;
    let r = s
        .lease(100, &acquire("a", 1, Seen::default(), t), t)
        .unwrap();
    let original = s.tables.clone();
    let oid = s.database_oid;
    let mut t = T0 + 30_000;
    s.put_back_copy(&s.tables.clone());
    s.connect(101, t);
    assert_eq!(s.hello(101, "a"), Ok(true));
    let mut head = s
        .lease(101, &renew("a", &[], seen_of(&r.head), t), t)
        .unwrap()
        .head;
    assert!(head.fenced_until_ms.is_some(), "{head:?}");
    let copied = head.incarnation.clone();
    t += FENCE + 1_000;
    for _ in 0..3 {
        let got = s
            .lease(101, &acquire("a", 1, seen_of(&head), t), t)
            .unwrap();
        head = got.head;
        t += 1_000;
    }
    assert_eq!(head.incarnation, copied);
    assert!(head.grants > r.head.grants, "{head:?}");
    let now = T0 + 90_000 + FENCE + MARKS_PASSED;
    s.put_back_database(&original, oid);
    s.connect(102, now);
    assert_eq!(s.hello(102, "a"), Ok(true));
    let back = s
        .lease(102, &renew("a", &[], seen_of(&head), now), now)
        .unwrap();
    assert_eq!(back.head.fenced_until_ms, Some(now + FENCE), "{back:?}");
}

#[test]
fn a_fleet_moved_from_another_registry_database_of_the_cluster_fences() {
    // The registry's database `old` dropped (or out of reach), its holders
    // pointed at a new registry database of the same cluster: each may
    // still use a block `old` granted until its deadline, which `new`
    // never saw. Their token (the data directory's key, one for every
    // database) is the only evidence: `new` fences. So does the same
    // token presented by the lease role when one role serves two registry
    // databases (tests/fleet/test_adversarial_s22.py), which this
    // registry cannot tell from it: one lease role per registry database
    // (docs/design/limitations.md).
    let mut s = store_with(&["a"]);
    let t = T0 + 1_000;
    let got = s
        .lease(100, &acquire("a", 1, Seen::default(), t), t)
        .unwrap();
    let (block, mut head) = (got.blocks[0].block, got.head);
    for i in 1..=3 {
        let now = t + 1_000 * i;
        head = s
            .lease(100, &renew("a", &[block], seen_of(&head), now), now)
            .unwrap()
            .head;
    }
    // CREATE DATABASE new; CREATE EXTENSION there (the key file kept).
    let oid = s.database_oid + 7;
    s.put_back_database(&memory::Tables::default(), oid);
    s.create_extension(t + 5_000);
    let made = incarnation(&s);
    let now = t + 20_000;
    s.connect(200, now);
    assert_eq!(s.hello(200, "a"), Ok(true));
    let moved = s
        .lease(200, &acquire("a", 1, seen_of(&head), now), now)
        .unwrap();
    assert_ne!(moved.head.incarnation, made, "{moved:?}");
    assert_eq!(moved.head.fenced_until_ms, Some(now + FENCE), "{moved:?}");
    assert!(moved.blocks.is_empty(), "{moved:?}");
}

#[test]
fn the_original_put_back_after_a_copy_that_granted_less_fences() {
    // tests/fleet/test_adversarial_s23.py: as above, but the original went
    // on granting after the copy was taken, more than the copy did while
    // it served, and was put back long after the postmaster started: the
    // holders' count was below the original's, the windows for an
    // incarnation it never had closed: no fence, 64,058 IDs made twice on
    // PostgreSQL 15. The copy's token names the copy's database.
    let mut s = store_with(&["a", "busy"]);
    let t = T0 + 1_000;
    let r = s
        .lease(100, &acquire("a", 1, Seen::default(), t), t)
        .unwrap();
    let copied = s.tables.clone();
    let oid = s.database_oid;
    let got = s
        .lease(101, &acquire("busy", 1, Seen::default(), t), t)
        .unwrap();
    let (blk, mut busy) = (got.blocks[0].block, got.head);
    for i in 0..50 {
        let now = t + 100 * i;
        busy = s
            .lease(101, &renew("busy", &[blk], seen_of(&busy), now), now)
            .unwrap()
            .head;
    }
    let original = s.tables.clone();
    let mut t = T0 + 30_000;
    s.put_back_copy(&copied);
    s.connect(102, t);
    assert_eq!(s.hello(102, "a"), Ok(true));
    let mut head = s
        .lease(102, &renew("a", &[], seen_of(&r.head), t), t)
        .unwrap()
        .head;
    assert!(head.fenced_until_ms.is_some(), "{head:?}");
    t += FENCE + 1_000;
    for _ in 0..3 {
        head = s
            .lease(102, &acquire("a", 1, seen_of(&head), t), t)
            .unwrap()
            .head;
        t += 1_000;
    }
    assert!(head.grants < busy.grants, "{head:?} {busy:?}");
    let now = T0 + 200_000 + FENCE + MARKS_PASSED;
    s.put_back_database(&original, oid);
    s.connect(103, now);
    assert_eq!(s.hello(103, "a"), Ok(true));
    let back = s
        .lease(103, &renew("a", &[], seen_of(&head), now), now)
        .unwrap();
    assert_eq!(back.head.fenced_until_ms, Some(now + FENCE), "{back:?}");
    // Once: the copy's incarnation joined the lineage.
    let later = now + FENCE + 1_000;
    let again = s
        .lease(103, &renew("a", &[], seen_of(&head), later), later)
        .unwrap();
    assert_eq!(again.head.incarnation, back.head.incarnation, "{again:?}");
}

#[test]
fn a_row_from_before_its_database_was_recorded_fences_once_and_so_does_its_copy() {
    // tests/fleet/test_adversarial_s21.py: a copy taken on 0.7.0 (its row
    // names no database), updated and put back after the registry moved on,
    // learned its database unfenced: 45,949 IDs made twice on PostgreSQL 15.
    let mut s = store_with(&["a"]);
    if let Some(r) = s.tables.rows.registry.as_mut() {
        r.database_oid = None;
    }
    let copy = s.tables.clone();
    let first = incarnation(&s);
    let r = s
        .lease(100, &acquire("a", 1, Seen::default(), T0), T0)
        .unwrap();
    assert_eq!(r.head.fenced_until_ms, Some(T0 + FENCE), "{r:?}");
    assert_ne!(r.head.incarnation, first);
    let row = s.tables.rows.registry.clone().unwrap();
    assert_eq!(row.database_oid, Some(s.database_oid));
    assert!(row.cause.contains("names no database"), "{}", row.cause);
    // Once: the row names its database now.
    let later = T0 + FENCE + 1_000;
    let r2 = s
        .lease(100, &renew("a", &[], seen_of(&r.head), later), later)
        .unwrap();
    assert_eq!(r2.head.incarnation, row.incarnation, "{r2:?}");
    assert_eq!(r2.head.fenced_until_ms, None, "{r2:?}");
    // The copy, put back long after the postmaster started: fenced too.
    let now = T0 + 90_000 + FENCE + MARKS_PASSED;
    s.put_back_copy(&copy);
    s.connect(101, now);
    assert_eq!(s.hello(101, "b"), Ok(true));
    let r3 = s
        .lease(101, &acquire("b", 1, Seen::default(), now), now)
        .unwrap();
    assert_eq!(r3.head.fenced_until_ms, Some(now + FENCE), "{r3:?}");
}

#[test]
fn history_keeps_the_newest_incarnations_of_the_lineage() {
    let mut s = store_with(&["a"]);
    let mut names = Vec::new();
    for i in 0..(begin::HISTORY_KEPT as i64 + 3) {
        names.push(incarnation(&s));
        s.forget(T0 + i, super::begin::Forgotten::Deleted, None);
    }
    let row = s.tables.rows.registry.clone().unwrap();
    assert_eq!(row.history, names[3..].to_vec());
    assert!(!row.had(&names[2]) && row.had(&names[3]));
}

fn role_limits(per_role: Option<i64>) -> LimitsRow {
    LimitsRow {
        max_lease_ms: limits::DEFAULT_MAX_LEASE_MS,
        max_grace_ms: limits::DEFAULT_MAX_GRACE_MS,
        max_ahead_ms: limits::DEFAULT_MAX_AHEAD_MS,
        max_blocks_per_node: limits::DEFAULT_MAX_BLOCKS_PER_NODE,
        max_blocks_per_role: per_role,
        ..LimitsRow::default()
    }
}

/// Sessions 100.. of `role`, each introduced as node `{role}-{i}`.
fn sessions_of(s: &mut Store, role: &str, first_pid: u64, n: u64) -> Vec<(u64, String)> {
    (0..n)
        .map(|i| {
            let pid = first_pid + i;
            let node = format!("{role}-{i}");
            s.connect_as(pid, T0, role);
            assert_eq!(s.hello(pid, &node), Ok(true));
            (pid, node)
        })
        .collect()
}

/// Blocks each session of `sessions` takes, one acquire of 8 at a time
/// until refused or given none.
fn take_all(s: &mut Store, sessions: &[(u64, String)], now: i64) -> Vec<usize> {
    sessions
        .iter()
        .map(|(pid, node)| {
            let mut taken = 0;
            for _ in 0..64 {
                match s.lease(*pid, &acquire(node, 8, Seen::default(), now), now) {
                    Ok(r) if !r.blocks.is_empty() => taken += r.blocks.len(),
                    _ => break,
                }
            }
            taken
        })
        .collect()
}

#[test]
fn the_sessions_of_one_login_role_hold_no_more_than_its_limit() {
    // The lease role's 20 sessions (its documented CONNECTION LIMIT), each
    // a made-up node, took every block but the one a holder had, and a new
    // server got none: with max_blocks_per_role they take one server's
    // share, whatever their number.
    let mut s = Store::created(T0, 7);
    s.set_limits(Some(role_limits(Some(8))), T0);
    let a = sessions_of(&mut s, "server_a", 100, 1);
    assert_eq!(take_all(&mut s, &a, T0), vec![8]);
    let leaked = sessions_of(&mut s, "server_x", 200, 20);
    let taken = take_all(&mut s, &leaked, T0);
    assert_eq!(taken.iter().sum::<usize>(), 8, "{taken:?}");
    // The role at its limit is refused, saying which limit.
    let refused = s
        .lease(210, &acquire("server_x-10", 1, Seen::default(), T0), T0)
        .unwrap_err();
    assert_eq!(refused.code, SqlState::ProgramLimitExceeded);
    assert!(
        refused.message.ends_with(
            "the sessions of its login role hold 8 blocks already: the registry's limit max_blocks_per_role is 8"
        ),
        "{}",
        refused.message
    );
    // A new server of its own role gets what it asks for.
    let b = sessions_of(&mut s, "server_b", 300, 1);
    assert_eq!(take_all(&mut s, &b, T0), vec![8]);
    // The role's blocks count while their lease runs, as a node's do;
    // then the role leases again (blocks free by then: past their grace).
    let rows = &s.tables.rows.blocks;
    assert_eq!(blocks::role_held(rows, "server_x", T0 + LEASE - 1), 8);
    assert_eq!(blocks::role_held(rows, "server_x", T0 + LEASE), 0);
    let later = T0 + LEASE + GRACE + 1;
    let r = s
        .lease(
            205,
            &acquire("server_x-5", 8, Seen::default(), later),
            later,
        )
        .unwrap();
    assert_eq!(r.blocks.len(), 8);
}

#[test]
fn a_renewal_of_a_lapsed_block_takes_room_within_the_roles_limit() {
    // The simulation's seed 23: a role's lapsed block (within its grace,
    // still its node's) renewed after the role had leased up to its limit
    // made the role hold one block more than max_blocks_per_role.
    let mut s = Store::created(T0, 7);
    s.set_limits(Some(role_limits(Some(2))), T0);
    let x = sessions_of(&mut s, "server_x", 100, 2);
    let first = s
        .lease(100, &acquire(&x[0].1, 2, Seen::default(), T0), T0)
        .unwrap();
    let mine: Vec<u32> = first.blocks.iter().map(|b| b.block).collect();
    assert_eq!(mine.len(), 2);
    // Only the first is renewed: the second lapses (its grace runs).
    let t = T0 + LEASE - 100;
    s.lease(100, &renew(&x[0].1, &mine[..1], seen_of(&first.head), t), t)
        .unwrap();
    let t = T0 + LEASE + 100;
    let other = s
        .lease(101, &acquire(&x[1].1, 1, Seen::default(), t), t)
        .unwrap();
    assert_eq!(other.blocks.len(), 1);
    let reply = s
        .lease(100, &renew(&x[0].1, &mine, seen_of(&first.head), t), t)
        .unwrap();
    assert_eq!(reply.blocks.len(), 1, "{reply:?}");
    assert_eq!(blocks::role_held(&s.tables.rows.blocks, "server_x", t), 2);
}

#[test]
fn one_shared_login_role_is_bounded_per_node_only() {
    // No max_blocks_per_role (the default): the sessions of one role shared
    // by every server are told apart by nothing but their node ids, which
    // they make up: 20 of them leave a new server nothing beyond the
    // reserve's last blocks (outside the assumptions: docs/operations/fleet.md).
    let mut s = Store::created(T0, 7);
    s.set_limits(Some(role_limits(None)), T0);
    let a = sessions_of(&mut s, "snowflake_lease", 100, 1);
    take_all(&mut s, &a, T0);
    let xs: Vec<(u64, String)> = (0..20u64)
        .map(|i| {
            let (pid, node) = (200 + i, format!("made-up-{i}"));
            s.connect_as(pid, T0, "snowflake_lease");
            assert_eq!(s.hello(pid, &node), Ok(true));
            (pid, node)
        })
        .collect();
    let taken: usize = take_all(&mut s, &xs, T0).iter().sum();
    assert_eq!(taken, 64 - 8);
    let free = 64 - s.tables.rows.blocks.iter().filter(|b| !b.free(T0)).count();
    assert_eq!(free, 0);
}

#[test]
fn a_row_recorded_before_roles_counts_once_renewed() {
    // A 0.7.0 registry's rows have no role; a renewal records the role of
    // the renewing session.
    let mut s = Store::created(T0, 7);
    s.set_limits(Some(role_limits(Some(2))), T0);
    let a = sessions_of(&mut s, "server_a", 100, 1);
    let r = s
        .lease(100, &acquire("server_a-0", 2, Seen::default(), T0), T0)
        .unwrap();
    for b in &mut s.tables.rows.blocks {
        b.holder_role = None;
    }
    assert_eq!(blocks::role_held(&s.tables.rows.blocks, "server_a", T0), 0);
    let held: Vec<u32> = r.blocks.iter().map(|b| b.block).collect();
    s.lease(100, &renew(&a[0].1, &held, seen_of(&r.head), T0), T0)
        .unwrap();
    assert_eq!(blocks::role_held(&s.tables.rows.blocks, "server_a", T0), 2);
}

#[test]
fn a_session_that_gave_up_its_nodes_lock_is_no_other_node() {
    let mut s = store_with(&["a"]);
    s.lease(100, &acquire("a", 2, Seen::default(), T0), T0)
        .unwrap();
    s.unlock_node(100);
    let refused = s.hello(100, "b").unwrap_err();
    assert_eq!(refused.code, SqlState::ProgramLimitExceeded);
    // Its own node again: yes.
    assert_eq!(s.hello(100, "a"), Ok(true));
    // Holding another node's lock, with no block: refused too.
    s.connect(101, T0);
    assert_eq!(s.hello(101, "c"), Ok(true));
    assert!(s.hello(101, "d").is_err());
}

#[derive(Clone, Debug)]
enum RoleStep {
    /// Session `i` (of role `i % 3`) acquires `want`.
    Acquire {
        i: usize,
        want: i64,
    },
    /// Session `i` gives up its node's lock and introduces node `node`.
    Become {
        i: usize,
        node: usize,
    },
    /// Session `i` ends, and a new one of its role takes its place.
    Reconnect {
        i: usize,
    },
    Advance {
        ms: i64,
    },
}

fn role_step() -> impl Strategy<Value = RoleStep> {
    prop_oneof![
        (0..6usize, 1..9i64).prop_map(|(i, want)| RoleStep::Acquire { i, want }),
        (0..6usize, 0..12usize).prop_map(|(i, node)| RoleStep::Become { i, node }),
        (0..6usize).prop_map(|i| RoleStep::Reconnect { i }),
        (1..4_000i64).prop_map(|ms| RoleStep::Advance { ms }),
    ]
}

proptest! {
    /// Six sessions of three login roles, each session introducing any of
    /// twelve nodes and leasing what it may: no session holds blocks of
    /// two nodes, and no role holds more than max_blocks_per_role.
    #[test]
    fn one_node_per_session_and_the_role_limit_hold(
        steps in proptest::collection::vec(role_step(), 1..80),
        per_role in 1..20i64,
    ) {
        let mut s = Store::created(T0, 7);
        s.set_limits(Some(role_limits(Some(per_role))), T0);
        let roles = ["r0", "r1", "r2"];
        let mut pids: Vec<u64> = (0..6u64).map(|i| 100 + i).collect();
        for (i, &pid) in pids.iter().enumerate() {
            s.connect_as(pid, T0, roles[i % 3]);
        }
        let mut next_pid = 200;
        let mut now = T0;
        for st in steps {
            match st {
                RoleStep::Advance { ms } => now += ms,
                RoleStep::Reconnect { i } => {
                    s.disconnect(pids[i]);
                    pids[i] = s.connect_as(next_pid, now, roles[i % 3]);
                    next_pid += 1;
                }
                RoleStep::Become { i, node } => {
                    s.unlock_node(pids[i]);
                    let _ = s.hello(pids[i], &format!("n{node}"));
                }
                RoleStep::Acquire { i, want } => {
                    let node = s.sessions.get(&pids[i]).and_then(|x| x.node());
                    if let Some(node) = node {
                        let _ = s.lease(pids[i], &acquire(&node, want, Seen::default(), now), now);
                    }
                }
            }
            let rows = &s.tables.rows.blocks;
            for r in roles {
                prop_assert!(blocks::role_held(rows, r, now) <= per_role, "role {} above its limit", r);
            }
            for x in s.sessions.values() {
                let mut nodes: Vec<&str> = rows
                    .iter()
                    .filter(|b| b.holder_session.as_deref() == Some(x.id.as_str()) && !b.free(now))
                    .filter_map(|b| b.holder_node.as_deref())
                    .collect();
                nodes.dedup();
                nodes.sort_unstable();
                nodes.dedup();
                prop_assert!(nodes.len() <= 1, "session {} holds blocks of nodes {:?}", x.id, nodes);
            }
        }
    }
}

#[test]
fn rows_forgotten_fence_and_raise_every_mark_to_the_floor() {
    let mut s = store_with(&["a", "b"]);
    let r = s
        .lease(100, &acquire("a", 2, Seen::default(), T0), T0)
        .unwrap();
    assert_eq!(r.head.fenced_until_ms, None, "{r:?}");
    let old = incarnation(&s);
    s.forget(T0 + 10, begin::Forgotten::Restored, None);
    let row = s.tables.rows.registry.clone().unwrap();
    assert_ne!(row.incarnation, old);
    assert!(row.had(&old), "{row:?}");
    assert_eq!(row.cause, "rows of the lease table were restored");
    let lim = limits::in_force(s.tables.rows.limits.as_ref(), T0 + 10);
    assert_eq!(row.fenced_until_ms, Some(T0 + 10 + lim.fence_ms()));
    assert!(row.fence_floor_ms > T0, "{row:?}");
    assert!(!s.tables.rows.blocks.is_empty());
    for b in &s.tables.rows.blocks {
        assert!(b.high_water_ms >= row.fence_floor_ms, "{b:?} below {row:?}");
    }
    // A call now is refused new blocks until the fence ends.
    let r = s
        .lease(101, &acquire("b", 1, Seen::default(), T0 + 20), T0 + 20)
        .unwrap();
    assert!(r.blocks.is_empty(), "{r:?}");
}

#[test]
fn a_statement_that_removed_no_row_forgets_nothing() {
    // tests/fleet/test_adversarial_s21.py and _s22.py: a DELETE of no row,
    // a TRUNCATE of the empty table, by a role with only that right on
    // it, fenced the fleet (12 min by default).
    for how in [begin::Forgotten::Deleted, begin::Forgotten::Truncated] {
        let mut s = store_with(&["a"]);
        let before = incarnation(&s);
        s.forget(T0 + 10, how, Some(0));
        assert_eq!(incarnation(&s), before, "{how:?}");
        // A count not known (a TRUNCATE under a transaction snapshot), or
        // a row removed: a new, fenced incarnation.
        for removed in [None, Some(1)] {
            let mut s = store_with(&["a"]);
            s.forget(T0 + 10, how, removed);
            assert_ne!(incarnation(&s), before, "{how:?} {removed:?}");
            let row = s.tables.rows.registry.clone().unwrap_or_default();
            assert_eq!(
                row.fenced_until_ms,
                Some(T0 + 10 + FENCE),
                "{how:?} {removed:?}"
            );
        }
    }
    // Rows restored are no removal: the count does not apply.
    let mut s = store_with(&["a"]);
    let before = incarnation(&s);
    s.forget(T0 + 10, begin::Forgotten::Restored, Some(0));
    assert_ne!(incarnation(&s), before);
}

#[test]
fn rows_forgotten_before_the_registry_row_was_made_change_nothing() {
    let mut s = Store::created(T0, 7);
    s.tables.rows.registry = None;
    s.forget(T0, begin::Forgotten::Truncated, None);
    assert_eq!(s.tables.rows.registry, None);
}

#[test]
fn a_lowered_limit_bounds_fences_only_once_grants_under_the_higher_have_run_out() {
    let high = role_limits(None);
    let low = LimitsRow {
        max_lease_ms: 2_000,
        max_grace_ms: 1_000,
        max_ahead_ms: 3_000,
        ..high.clone()
    };
    // Nothing leased, no mark ahead: the lower limits bound fences at once.
    let mut idle = store_with(&["a"]);
    idle.set_limits(Some(high.clone()), T0);
    idle.set_limits(Some(low.clone()), T0 + 1);
    let lim = limits::in_force(idle.tables.rows.limits.as_ref(), T0 + 2);
    assert_eq!(lim.fence_ms(), 3_000, "{lim:?}");
    // A block leased under the higher limits: fences keep them until the
    // longest grant they allowed has run out.
    let mut s = store_with(&["a"]);
    s.set_limits(Some(high.clone()), T0);
    let r = s
        .lease(100, &acquire("a", 1, Seen::default(), T0), T0)
        .unwrap();
    assert_eq!(r.blocks.len(), 1, "{r:?}");
    s.set_limits(Some(low), T0 + 10);
    let row = s.tables.rows.limits.clone().unwrap();
    let until = T0 + 10 + high.max_ahead_ms.max(high.max_lease_ms) + high.max_grace_ms;
    assert_eq!(row.previous_until_ms, Some(until), "{row:?}");
    let lim = limits::in_force(Some(&row), T0 + 20);
    assert_eq!(lim.fence_ms(), high.max_lease_ms + high.max_grace_ms);
    assert_eq!(lim.max_lease_ms, 2_000);
    // A forget now fences for the higher limits.
    s.forget(T0 + 20, begin::Forgotten::Deleted, None);
    let reg = s.tables.rows.registry.clone().unwrap();
    assert_eq!(
        reg.fenced_until_ms,
        Some(T0 + 20 + high.max_lease_ms + high.max_grace_ms)
    );
    // Past the window, the lower limits alone.
    let lim = limits::in_force(Some(&row), until + 1);
    assert_eq!(lim.fence_ms(), 3_000);
}

#[test]
fn another_roles_session_on_a_nodes_lock_makes_no_copy_of_it() {
    // s23's attack with a login role per server: X's role takes A's node
    // lock while A's session is gone (a registry restart); A's server was
    // taken for a copy and renamed itself. Only a session of A's own role
    // shows the node in use.
    use super::memory::NodeKey;
    let mut s = Store::created(T0, 7);
    s.connect_as(1, T0, "server_a");
    assert_eq!(s.hello(1, "a"), Ok(true));
    let seen: Vec<NodeKey> = s.sessions[&1].node_locks.clone();
    s.disconnect(1);
    s.connect_as(2, T0, "server_x");
    for key in &seen {
        assert!(s.squat(2, key));
    }
    s.connect_as(3, T0 + 1, "server_a");
    assert_eq!(s.hello(3, "a"), Ok(true), "A keeps its node id");
    assert_eq!(s.sessions[&3].node().as_deref(), Some("a"));
    assert!(s
        .lease(3, &acquire("a", 1, Seen::default(), T0 + 1), T0 + 1)
        .is_ok());
    // A copy of A's data directory (A's role) is still told the node is
    // in use, whichever key A holds.
    s.connect_as(4, T0 + 2, "server_a");
    assert_eq!(s.hello(4, "a"), Ok(false));
    // X's own hello of node a is a node of its own role: no key of A's.
    s.connect_as(5, T0 + 2, "server_x");
    assert_eq!(s.hello(5, "a"), Ok(true));
    assert_eq!(s.hello(4, "a"), Ok(false));
    // Every key of A's role squatted while A reconnects: the squatter's
    // session is ended (tests/fleet/test_adversarial_s25.py: X gathered
    // all four over A's broken connections, and A was refused for good).
    s.disconnect(3);
    s.disconnect(4);
    s.connect_as(7, T0 + 3, "server_x");
    for slot in 0..super::hello::NODE_SLOTS {
        let key = NodeKey {
            node: "a".into(),
            role: "server_a".into(),
            slot,
        };
        assert!(s.squat(7, &key));
    }
    s.connect_as(6, T0 + 3, "server_a");
    assert_eq!(s.hello(6, "a"), Ok(true));
    assert!(!s.sessions.contains_key(&7), "the squatter's session ended");
}

#[test]
fn prepared_transactions_cannot_hold_every_key_of_a_node() {
    // tests/fleet/test_adversarial_s26.py: with max_prepared_transactions
    // = 10, X's role took each key A's registry session gave up
    // (pg_advisory_xact_lock, then PREPARE TRANSACTION: no session to end)
    // and after four broken connections A was refused 55P03 for good. A
    // node has a key more than the prepared transactions allowed.
    use super::memory::NodeKey;
    let mut s = Store::created(T0, 7);
    s.max_prepared_transactions = 10;
    let mut pid = 100;
    let mut held = 0;
    loop {
        pid += 1;
        s.connect_as(pid, T0, "server_a");
        assert_eq!(
            s.hello(pid, "a"),
            Ok(true),
            "A introduced after {held} keys kept"
        );
        let key: NodeKey = s.sessions[&pid].node_locks[0].clone();
        s.disconnect(pid);
        if !s.squat_prepared(&key) {
            break;
        }
        held += 1;
    }
    assert_eq!(
        held, 10,
        "every prepared transaction allowed holds a key of A's"
    );
    assert_eq!(s.prepared.len(), 10);
    // With four keys, as before, A would have been refused.
    s.max_prepared_transactions = 0;
    s.connect_as(pid + 1, T0, "server_a");
    assert_eq!(
        s.hello(pid + 1, "a").map_err(|r| r.code),
        Err(SqlState::LockNotAvailable)
    );
}

#[test]
fn a_copy_put_back_under_the_registrys_own_oid_fences() {
    // tests/fleet/test_adversarial_s24.py: CREATE DATABASE fleet TEMPLATE
    // snap OID <the original's> after the original was dropped. Its row
    // names that OID, the holders' tokens too, and this postmaster signed
    // the original's counts: no rule told it, and a new server leased the
    // block a holder used from the original (70,786 IDs made twice on
    // PostgreSQL 15). Its row's count is below one found before.
    let mut s = store_with(&["a", "busy"]);
    let t = T0 + 1_000;
    let copied = s.tables.clone();
    let got = s
        .lease(100, &acquire("a", 1, Seen::default(), t), t)
        .unwrap();
    let (block, mut head) = (got.blocks[0].block, got.head);
    for i in 1..20 {
        let now = t + 100 * i;
        head = s
            .lease(100, &renew("a", &[block], seen_of(&head), now), now)
            .unwrap()
            .head;
    }
    let oid = s.database_oid;
    let now = T0 + 200_000 + FENCE + MARKS_PASSED;
    s.put_back_database(&copied, oid);
    // A new server first: it knows nothing.
    s.connect(103, now);
    assert_eq!(s.hello(103, "b"), Ok(true));
    let b = s
        .lease(103, &acquire("b", 8, Seen::default(), now), now)
        .unwrap();
    assert_eq!(b.head.fenced_until_ms, Some(now + FENCE), "{b:?}");
    assert!(
        b.blocks
            .iter()
            .all(|f| f.block != block || f.floor_ms > now),
        "{b:?}"
    );
    let row = s.tables.rows.registry.clone().unwrap();
    assert!(row.cause.contains("under its OID"), "{}", row.cause);
    assert!(row.grants >= head.grants, "{row:?} {head:?}");
    // Once: the count found is the row's now.
    let later = now + FENCE + 1_000;
    let again = s
        .lease(103, &renew("b", &[], seen_of(&b.head), later), later)
        .unwrap();
    assert_eq!(again.head.incarnation, b.head.incarnation, "{again:?}");
}

#[test]
fn a_release_after_a_fence_keeps_the_mark_the_fence_raised() {
    // The simulation (seed 41 KeptAny): a registry restored in place; the
    // lease role's first call leases a block its forgotten holder still
    // used, with the restored mark as floor; a holder's evidence then
    // fences, raising every mark; the lease role releases the block with
    // a mark of 0, which took it back to its lease's floor, and a new
    // server leased it below IDs the forgotten holder had made.
    let mut s = store_with(&["a", "rogue"]);
    let r = s
        .lease(100, &acquire("a", 1, Seen::default(), T0), T0)
        .unwrap();
    let block = r.blocks[0].block;
    let snapshot = s.tables.clone();
    let mut head = r.head;
    for i in 1..10 {
        let t = T0 + 500 * i;
        head = s
            .lease(100, &renew("a", &[block], seen_of(&head), t), t)
            .unwrap()
            .head;
    }
    // Restored in place (a restart), after a's lease and grace ran out by
    // the restored row's clock.
    let now = T0 + 30_000;
    s.tables = snapshot;
    s.sessions.clear();
    s.postmaster_start_ms = now;
    s.connect_as(101, now, "rogue");
    assert_eq!(s.hello(101, "rogue"), Ok(true));
    let Call::Acquire(mut want_a) = acquire("rogue", 1, Seen::default(), now) else {
        unreachable!()
    };
    want_a.allowed = vec![i64::from(block)];
    let got = s.lease(101, &Call::Acquire(want_a), now).unwrap();
    assert_eq!(got.blocks.len(), 1, "{got:?}");
    s.connect_as(102, now + 10, "snowflake_lease");
    assert_eq!(s.hello(102, "a"), Ok(true));
    let fenced = s
        .lease(
            102,
            &renew("a", &[block], seen_of(&head), now + 10),
            now + 10,
        )
        .unwrap();
    assert!(fenced.head.fenced_until_ms.is_some(), "{fenced:?}");
    let fence_floor = s.tables.rows.registry.as_ref().unwrap().fence_floor_ms;
    let released = s
        .release(101, &release("rogue", block, 0, Seen::default()), now + 20)
        .unwrap();
    assert!(released.released, "{released:?}");
    let row = s
        .tables
        .rows
        .blocks
        .iter()
        .find(|b| b.block == block)
        .unwrap();
    assert!(
        row.high_water_ms >= fence_floor,
        "{row:?} below {fence_floor}"
    );
}

/// What a registry updated to 0.8.0 knows of a block leased before.
enum Update {
    /// No session, no role.
    From060,
    /// No role.
    From070,
}

/// Node a (session 100) leased one block; its row as `update` leaves it.
fn leased_before(update: Update) -> (Store, u32) {
    let mut s = store_with(&["a"]);
    let got = s
        .lease(100, &acquire("a", 1, Seen::default(), T0), T0)
        .unwrap();
    for b in s.tables.rows.blocks.iter_mut() {
        b.holder_role = None;
        if matches!(update, Update::From060) {
            b.holder_session = None;
        }
    }
    (s, got.blocks[0].block)
}

#[test]
fn a_row_from_0_6_0_with_no_session_passes_to_no_session_naming_its_node() {
    // tests/fleet/test_adversarial_s27.py: after the update from 0.6.0,
    // block rows record no session; another role introduced the holder's
    // node, renewed the block and held it from then on.
    let (mut s, block) = leased_before(Update::From060);
    s.connect_as(101, T0 + 10, "server_x");
    assert_eq!(s.hello(101, "a"), Ok(true));
    let stolen = s
        .lease(
            101,
            &renew("a", &[block], Seen::default(), T0 + 20),
            T0 + 20,
        )
        .unwrap();
    assert!(stolen.blocks.iter().all(|f| f.block != block), "{stolen:?}");
}

#[test]
fn a_row_from_0_7_0_with_no_role_passes_only_once_it_lapsed() {
    // tests/fleet/test_adversarial_s25.py: right after the update from
    // 0.7.0 (its block rows record no role), another role introduced the
    // holder's node and renewed its block naming the holder's live session
    // as its previous: it took the block, and the holder made no ID.
    let (mut s, block) = leased_before(Update::From070);
    let holder = s.sessions[&100].id.clone();
    let naming = |node: &str, t: i64| {
        let Call::Renew(mut r) = renew(node, &[block], Seen::default(), t) else {
            unreachable!()
        };
        r.previous_session = holder.clone();
        Call::Renew(r)
    };
    s.connect_as(101, T0 + 10, "server_x");
    assert_eq!(s.hello(101, "a"), Ok(true));
    let stolen = s.lease(101, &naming("a", T0 + 20), T0 + 20).unwrap();
    assert!(stolen.blocks.iter().all(|f| f.block != block), "{stolen:?}");
    let row = s
        .tables
        .rows
        .blocks
        .iter()
        .find(|b| b.block == block)
        .unwrap();
    assert_eq!(
        row.holder_session.as_deref(),
        Some(holder.as_str()),
        "{row:?}"
    );
    // The holder's session gone (away at the update): X guessing its start
    // gets nothing (tests/fleet/test_adversarial_s26.py: it took the block,
    // and the holder made no ID while X renewed), nor does the holder's next
    // session, which cannot show its role was the row's.
    s.disconnect(100);
    let stolen = s.lease(101, &naming("a", T0 + 30), T0 + 30).unwrap();
    assert!(stolen.blocks.iter().all(|f| f.block != block), "{stolen:?}");
    s.disconnect(101);
    s.connect(102, T0 + 30);
    assert_eq!(s.hello(102, "a"), Ok(true));
    let refused = s.lease(102, &naming("a", T0 + 40), T0 + 40).unwrap();
    assert!(
        refused.blocks.iter().all(|f| f.block != block),
        "{refused:?}"
    );
    // Once its lease and grace ran out, a new lease, its mark the floor.
    let lapsed = T0 + 60_000 + 60_000;
    let Call::Acquire(mut only) = acquire("a", 1, Seen::default(), lapsed) else {
        unreachable!()
    };
    only.allowed = vec![i64::from(block)];
    let back = s.lease(102, &Call::Acquire(only), lapsed).unwrap();
    assert!(back.blocks.iter().any(|f| f.block == block), "{back:?}");
}
