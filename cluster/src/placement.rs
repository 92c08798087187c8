//! Placement of the units (tablets and document partitions) on the nodes: pure and
//! deterministic, recomputed by the map commands that change membership.
//!
//! # The rule
//!
//! The **usable** nodes are the members in state `Active` or `Down` (a down node keeps its
//! replicas listed: a restart should not copy its data elsewhere; routers skip it), but not
//! a down node marked lost (down for longer than the rebuild time: its units are rebuilt
//! elsewhere, as for a draining node). Joining
//! nodes get replicas once promoted (or marked active) after catching up with the Raft log;
//! draining nodes get none and lose theirs.
//!
//! Every unit targets `r = min(replicas, usable)` distinct usable nodes, and per kind (tablets,
//! partitions) the counts of targets per node differ by at most one. From the current targets
//! (a unit's serving replicas not leaving, plus its filling ones):
//!
//! 1. targets on nodes no longer usable are dropped; a unit with more than `r` drops those on
//!    the most loaded nodes (filling ones before serving ones on a tie);
//! 2. a unit with fewer than `r` takes the least loaded usable nodes it lacks (lowest id on a
//!    tie);
//! 3. while the most loaded node holds two more than the least loaded one, the first unit on
//!    the former and not on the latter moves there. Each move lowers the sum of squared loads,
//!    so this ends; a node added to a balanced cluster receives exactly its share and nothing
//!    else moves.
//!
//! # Moving is two-phase
//!
//! A new target joins the unit's `filling` replicas (it takes writes while it is copied). A
//! serving replica that is no longer a target is marked leaving (`ClusterMap::leaving`) and
//! keeps serving until every filling replica of the unit is ready (`ReplicaReady`), and then
//! only if the unit keeps a serving replica that is not down. A filling replica that is no
//! longer a target is dropped at once (it never served).
//!
//! The nodes follow the map: a node copies the units of `ClusterMap::filling_on` from a
//! serving replica and reports each ready; it drops its copy of a unit once
//! `ClusterMap::holds` says the map took it away.

use std::collections::BTreeMap;

use crate::NodeId;
use crate::map::{ClusterMap, NodeState, Unit};

/// The usable nodes, ascending.
pub fn usable(map: &ClusterMap) -> Vec<NodeId> {
    map.nodes
        .values()
        .filter(|n| n.state == NodeState::Active || (n.state == NodeState::Down && !n.lost))
        .map(|n| n.id)
        .collect()
}

/// The replicas `unit` is meant to have: serving ones not leaving, then filling ones.
pub fn targets(map: &ClusterMap, unit: Unit) -> Vec<NodeId> {
    let (nodes, filling) = map.replicas_of(unit);
    nodes.iter().filter(|&&n| !map.leaving.contains(&(unit, n))).chain(filling).copied().collect()
}

/// The number of targets each replica count aims at: `min(replicas, usable)`; a map from
/// before the replica count existed (0) keeps one.
pub fn replica_target(map: &ClusterMap, usable: usize) -> usize {
    (map.replicas.max(1) as usize).min(usable)
}

/// Recomputes the placement of every unit (see the module docs) and applies it.
pub fn rebalance(map: &mut ClusterMap) {
    let usable = usable(map);
    let r = replica_target(map, usable.len());
    let tablets: Vec<Unit> = map.tablets.iter().map(|t| t.unit()).collect();
    let partitions: Vec<Unit> = map.partitions.iter().map(|p| Unit::Partition(p.index)).collect();
    for units in [tablets, partitions] {
        let current: Vec<Vec<NodeId>> = units.iter().map(|&u| targets(map, u)).collect();
        let placed = balance(&current, &usable, r);
        for (unit, target) in units.into_iter().zip(placed) {
            set_targets(map, unit, &target);
        }
    }
}

/// Step 1 to 3 of the module docs on one kind of units.
pub fn balance(current: &[Vec<NodeId>], usable: &[NodeId], r: usize) -> Vec<Vec<NodeId>> {
    let mut load: BTreeMap<NodeId, usize> = usable.iter().map(|&n| (n, 0)).collect();
    let mut sets: Vec<Vec<NodeId>> = current
        .iter()
        .map(|c| {
            let mut s: Vec<NodeId> = Vec::with_capacity(r);
            for &n in c {
                if load.contains_key(&n) && !s.contains(&n) {
                    s.push(n);
                }
            }
            s
        })
        .collect();
    for n in sets.iter().flatten() {
        *load.entry(*n).or_default() += 1;
    }
    for s in &mut sets {
        while s.len() > r {
            // The most loaded; the later (filling) one on a tie.
            let Some((i, _)) = s.iter().enumerate().max_by_key(|&(i, n)| (load[n], i)) else {
                break;
            };
            let n = s.remove(i);
            *load.entry(n).or_default() -= 1;
        }
    }
    for s in &mut sets {
        while s.len() < r {
            let Some(n) =
                usable.iter().copied().filter(|n| !s.contains(n)).min_by_key(|n| (load[n], *n))
            else {
                break;
            };
            s.push(n);
            *load.entry(n).or_default() += 1;
        }
    }
    let bound = sets.len() * r + 1;
    for _ in 0..bound {
        let Some((&hi, &hl)) = load.iter().max_by_key(|&(n, l)| (*l, std::cmp::Reverse(*n))) else {
            break;
        };
        let Some((&lo, &ll)) = load.iter().min_by_key(|&(n, l)| (*l, *n)) else { break };
        if hl <= ll + 1 {
            break;
        }
        // A unit on `hi` and not on `lo` exists: `hi` holds more units than `lo`.
        let Some(s) = sets.iter_mut().find(|s| s.contains(&hi) && !s.contains(&lo)) else {
            break;
        };
        for n in s.iter_mut() {
            if *n == hi {
                *n = lo;
            }
        }
        *load.entry(hi).or_default() -= 1;
        *load.entry(lo).or_default() += 1;
    }
    sets
}

/// Makes `target` the unit's targets: new ones fill, serving ones not in it leave, filling
/// ones not in it are dropped; then [`settle`].
fn set_targets(map: &mut ClusterMap, unit: Unit, target: &[NodeId]) {
    let Some((nodes, filling)) = map.replicas_mut(unit) else { return };
    filling.retain(|n| target.contains(n));
    for &n in target {
        if !nodes.contains(&n) && !filling.contains(&n) {
            filling.push(n);
        }
    }
    let serving = nodes.clone();
    for n in serving {
        if target.contains(&n) {
            map.leaving.remove(&(unit, n));
        } else {
            map.leaving.insert((unit, n));
        }
    }
    settle(map, unit);
}

/// Drops the unit's leaving replicas once none of its replicas is filling and it keeps a
/// serving replica that is neither leaving nor down.
pub fn settle(map: &mut ClusterMap, unit: Unit) {
    let (nodes, filling) = map.replicas_of(unit);
    if !filling.is_empty() {
        return;
    }
    let leaving: Vec<NodeId> =
        nodes.iter().copied().filter(|&n| map.leaving.contains(&(unit, n))).collect();
    if leaving.is_empty() {
        return;
    }
    let kept = nodes.iter().any(|&n| !map.leaving.contains(&(unit, n)) && map.is_up(n));
    if !kept {
        return;
    }
    for n in &leaving {
        map.leaving.remove(&(unit, *n));
    }
    if let Some((nodes, _)) = map.replicas_mut(unit) {
        nodes.retain(|n| !leaving.contains(n));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loads(sets: &[Vec<NodeId>]) -> BTreeMap<NodeId, usize> {
        let mut l = BTreeMap::new();
        for n in sets.iter().flatten() {
            *l.entry(*n).or_default() += 1;
        }
        l
    }

    #[test]
    fn a_new_node_takes_its_share_and_nothing_else_moves() {
        // 40 units, 2 replicas, on nodes 1..=4 balanced (20 each).
        let usable = [1, 2, 3, 4];
        let first = balance(&vec![Vec::new(); 40], &usable, 2);
        assert!(loads(&first).values().all(|&l| l == 20), "{:?}", loads(&first));
        let usable = [1, 2, 3, 4, 5];
        let second = balance(&first, &usable, 2);
        assert!(loads(&second).values().all(|&l| l == 16), "{:?}", loads(&second));
        let moved: usize = first
            .iter()
            .zip(&second)
            .map(|(a, b)| b.iter().filter(|n| !a.contains(n)).count())
            .sum();
        assert_eq!(moved, 16);
        // Balanced input stays as it is.
        assert_eq!(balance(&second, &usable, 2), second);
        // A node leaving: its units go to the others, the rest stays.
        let third = balance(&second, &[1, 2, 3, 4], 2);
        let moved: usize = second
            .iter()
            .zip(&third)
            .map(|(a, b)| b.iter().filter(|n| !a.contains(n)).count())
            .sum();
        assert_eq!(moved, 16);
        assert!(third.iter().all(|s| s.len() == 2 && s[0] != s[1]));
    }

    #[test]
    fn fewer_nodes_than_replicas() {
        let sets = balance(&[vec![1], vec![], vec![2, 2, 9]], &[1, 2], 2);
        for s in &sets {
            let mut s = s.clone();
            s.sort();
            assert_eq!(s, vec![1, 2]);
        }
        assert_eq!(balance(&[vec![1]], &[], 0), vec![Vec::<NodeId>::new()]);
    }
}
