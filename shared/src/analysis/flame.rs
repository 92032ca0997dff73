//! The memory flame graph: every allocation attributed to a path of module scopes → operator →
//! call stack, weighted two ways: bytes still live at the allocated peak, and bytes allocated
//! over the whole trace.
//!
//! The root's live value is the allocated total at the peak. Memory that no recorded
//! allocation explains (allocated before recording began) is its own child, so the children
//! add up to the root.

use crate::hash::{FastMap as HashMap, FastSet};
use crate::model::{frame_role, shown_of_roles, EventType, FrameRole, StrId, Trace};
use serde::{Deserialize, Serialize};

/// What a node of the flame graph stands for. Siblings equal in both values and name come in
/// this order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FlameKind {
    Root,
    /// One component of a module path (`layer1`, `0`, `conv1`).
    Module,
    /// The innermost operator running when the allocation happened.
    Op,
    /// A call-stack frame, outermost first.
    Frame,
    /// Memory allocated before recording began, or allocations with nothing to attribute.
    Unattributed,
}

/// One node, in pre-order: a node's children follow it, largest total first.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FlameNode {
    pub name: String,
    pub kind: FlameKind,
    /// Index of the parent node; `None` for the root.
    pub parent: Option<u32>,
    pub depth: u16,
    /// Bytes of this subtree's allocations still live at the allocated peak.
    pub live_at_peak_bytes: u64,
    /// Bytes this subtree allocated over the whole trace.
    pub total_allocated_bytes: u64,
}

/// The flame graph of one device.
///
/// Serialized in columns with each name once ([`FlameWire`]): frame names repeat across the
/// tree, and the answer that carries the graph to the page is read on every file opened
/// (a ResNet-18 snapshot's graph: 613 KB of JSON as a list of nodes, 160 KB in columns).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(into = "FlameWire", try_from = "FlameWire")]
pub struct FlameGraph {
    /// Pre-order; node 0 is the root.
    pub nodes: Vec<FlameNode>,
    /// Subtrees smaller than this share of both root values were left out (their bytes stay in
    /// their parent's values).
    pub min_share: f64,
    pub nodes_left_out: usize,
}

/// A [`FlameGraph`] as it is written: each column a list over the nodes, names as indices
/// into `names`.
#[derive(Serialize, Deserialize)]
struct FlameWire {
    names: Vec<String>,
    name: Vec<u32>,
    kind: Vec<FlameKind>,
    /// The parent's index, -1 for the root.
    parent: Vec<i64>,
    depth: Vec<u16>,
    live_at_peak_bytes: Vec<u64>,
    total_allocated_bytes: Vec<u64>,
    min_share: f64,
    nodes_left_out: usize,
}

impl From<FlameGraph> for FlameWire {
    fn from(g: FlameGraph) -> FlameWire {
        let n = g.nodes.len();
        let mut index: HashMap<&str, u32> = HashMap::default();
        let mut names: Vec<String> = Vec::new();
        let mut w = FlameWire {
            names: Vec::new(),
            name: Vec::with_capacity(n),
            kind: Vec::with_capacity(n),
            parent: Vec::with_capacity(n),
            depth: Vec::with_capacity(n),
            live_at_peak_bytes: Vec::with_capacity(n),
            total_allocated_bytes: Vec::with_capacity(n),
            min_share: g.min_share,
            nodes_left_out: g.nodes_left_out,
        };
        for node in &g.nodes {
            let id = *index.entry(node.name.as_str()).or_insert_with(|| {
                names.push(node.name.clone());
                (names.len() - 1) as u32
            });
            w.name.push(id);
            w.kind.push(node.kind);
            w.parent.push(node.parent.map_or(-1, i64::from));
            w.depth.push(node.depth);
            w.live_at_peak_bytes.push(node.live_at_peak_bytes);
            w.total_allocated_bytes.push(node.total_allocated_bytes);
        }
        w.names = names;
        w
    }
}

impl TryFrom<FlameWire> for FlameGraph {
    type Error = String;

    fn try_from(w: FlameWire) -> Result<FlameGraph, String> {
        let n = w.name.len();
        super::same_lengths(
            "a flame graph",
            &[
                ("name", n),
                ("kind", w.kind.len()),
                ("parent", w.parent.len()),
                ("depth", w.depth.len()),
                ("live_at_peak_bytes", w.live_at_peak_bytes.len()),
                ("total_allocated_bytes", w.total_allocated_bytes.len()),
            ],
        )?;
        let mut nodes = Vec::with_capacity(n);
        for i in 0..n {
            let name = w
                .names
                .get(w.name[i] as usize)
                .ok_or_else(|| format!("flame node {i} names string {}, of {}", w.name[i], w.names.len()))?;
            let parent = match w.parent[i] {
                -1 => None,
                p if p >= 0 && (p as usize) < i => Some(p as u32),
                p => return Err(format!("flame node {i} has parent {p}: expected an earlier node or -1")),
            };
            nodes.push(FlameNode {
                name: name.clone(),
                kind: w.kind[i],
                parent,
                depth: w.depth[i],
                live_at_peak_bytes: w.live_at_peak_bytes[i],
                total_allocated_bytes: w.total_allocated_bytes[i],
            });
        }
        Ok(FlameGraph { nodes, min_share: w.min_share, nodes_left_out: w.nodes_left_out })
    }
}

/// Node `i`'s children, in order.
impl FlameGraph {
    pub fn children(&self, i: u32) -> impl Iterator<Item = u32> + '_ {
        self.nodes
            .iter()
            .enumerate()
            .skip(i as usize + 1)
            .take_while(move |(_, n)| n.depth > self.nodes[i as usize].depth)
            .filter(move |(_, n)| n.parent == Some(i))
            .map(|(j, _)| j as u32)
    }
}

struct Builder {
    /// Index into the builder's labels.
    name: u32,
    kind: FlameKind,
    live: u64,
    total: u64,
    children: HashMap<(FlameKind, u32), usize>,
}

/// Node names, each once: a graph's names repeat across its nodes, and making one per
/// allocation group was most of building the graph (ResNet-18 snapshot in the page's worker:
/// 13 ms).
struct Labels {
    names: Vec<String>,
    index: HashMap<String, u32>,
    /// By frame index: its label, once made.
    of_frame: Vec<u32>,
}

impl Labels {
    fn new(trace: &Trace) -> Labels {
        Labels { names: Vec::new(), index: HashMap::default(), of_frame: vec![u32::MAX; trace.stacks.frames.len()] }
    }

    fn of(&mut self, name: &str) -> u32 {
        if let Some(&i) = self.index.get(name) {
            return i;
        }
        self.names.push(name.to_owned());
        let i = (self.names.len() - 1) as u32;
        self.index.insert(name.to_owned(), i);
        i
    }

    /// The label of frame `frame`; `None` for an index past the frames (skipped, as
    /// [`crate::model::StackTable::stack`] skips it).
    fn of_frame(&mut self, trace: &Trace, frame: u32) -> Option<u32> {
        let f = trace.stacks.frames.get(frame as usize)?;
        let l = self.of_frame[frame as usize];
        if l != u32::MAX {
            return Some(l);
        }
        let l = self.of(&frame_label(trace, f));
        self.of_frame[frame as usize] = l;
        Some(l)
    }
}

/// Builds the flame graph of the device with the highest allocated peak. `min_share` (such as
/// 1e-4) drops subtrees below that share of the root in both values, to keep the graph drawable.
/// The runtime's frames are folded as wherever a stack is shown ([`crate::model::shown_frames`]):
/// [`flame_graph_with`] keeps them.
pub fn flame_graph(trace: &Trace, min_share: f64) -> FlameGraph {
    flame_graph_with(trace, min_share, true)
}

/// [`flame_graph`], with the runtime's frames folded (`fold_runtime`) or kept.
pub fn flame_graph_with(trace: &Trace, min_share: f64, fold_runtime: bool) -> FlameGraph {
    let ev = &trace.events;
    let peak = super::allocated_peak(trace);
    let device = peak.device;
    let live: FastSet<usize> = match peak.event {
        Some(i) => super::live_allocations_at(trace, i).into_iter().collect(),
        None => Default::default(),
    };
    let innermost_op = innermost_ops(trace);

    // Group allocations by (layer, op, stack) first: few distinct keys, many events.
    let mut groups: HashMap<(StrId, StrId, u32), (u64, u64)> = HashMap::default();
    let mut stack_cursor = 0usize;
    for i in 0..ev.len() {
        if ev.device[i] != device || ev.event_type(i) != EventType::Alloc {
            continue;
        }
        let op = innermost_op.get(i).copied().unwrap_or(StrId(u32::MAX));
        while stack_cursor < trace.stacks.event_stacks.len() && (trace.stacks.event_stacks[stack_cursor].0 as usize) < i {
            stack_cursor += 1;
        }
        let stack = match trace.stacks.event_stacks.get(stack_cursor) {
            Some(&(e, s)) if e as usize == i => s,
            _ => u32::MAX,
        };
        let g = groups.entry((ev.layer[i], op, stack)).or_default();
        g.1 += ev.size_bytes[i];
        if live.contains(&i) {
            g.0 += ev.size_bytes[i];
        }
    }

    // Each frame's role, once: a stack shows what crate::model::shown_of_roles keeps of it.
    let roles: Vec<FrameRole> = if fold_runtime {
        trace.stacks.frames.iter().map(|f| frame_role(trace.str(f.name), trace.str(f.filename))).collect()
    } else {
        Vec::new()
    };
    let mut stack_roles = Vec::new();
    let mut labels = Labels::new(trace);
    let root = labels.of("all");
    let mut tree = vec![Builder { name: root, kind: FlameKind::Root, live: 0, total: 0, children: HashMap::default() }];
    let child = |tree: &mut Vec<Builder>, parent: usize, kind: FlameKind, name: u32| -> usize {
        if let Some(&c) = tree[parent].children.get(&(kind, name)) {
            return c;
        }
        tree.push(Builder { name, kind, live: 0, total: 0, children: HashMap::default() });
        let c = tree.len() - 1;
        tree[parent].children.insert((kind, name), c);
        c
    };
    let mut explained_live = 0u64;
    let mut path = Vec::new();
    for ((layer, op, stack), (live_b, total_b)) in groups {
        path.clear();
        path.push(0usize);
        let mut node = 0usize;
        if let Some(l) = trace.opt_str(layer) {
            // A source line (`train.py:40 in step`) is one row, not split at its dot.
            let parts: Vec<&str> = if crate::model::is_source_layer(l) { vec![l] } else { l.split('.').collect() };
            for part in parts.into_iter().filter(|p| !p.is_empty()) {
                node = child(&mut tree, node, FlameKind::Module, labels.of(part));
                path.push(node);
            }
        }
        if let Some(o) = trace.opt_str(op) {
            node = child(&mut tree, node, FlameKind::Op, labels.of(o));
            path.push(node);
        }
        if stack != u32::MAX {
            let ids = trace.stacks.stack_frame_ids(stack);
            let shown: Vec<u32> = if fold_runtime {
                stack_roles.clear();
                stack_roles.extend(ids.iter().map(|&f| roles.get(f as usize).copied().unwrap_or(FrameRole::Program)));
                shown_of_roles(&stack_roles)
            } else {
                (0..ids.len() as u32).collect()
            };
            // Outermost first.
            for &k in shown.iter().rev() {
                let Some(label) = labels.of_frame(trace, ids[k as usize]) else { continue };
                node = child(&mut tree, node, FlameKind::Frame, label);
                path.push(node);
            }
        }
        if node == 0 {
            node = child(&mut tree, 0, FlameKind::Unattributed, labels.of("(no layer, operator or stack)"));
            path.push(node);
        }
        for &p in &path {
            tree[p].live += live_b;
            tree[p].total += total_b;
        }
        explained_live += live_b;
    }
    // Live memory at the peak that predates every recorded allocation.
    let before = peak.bytes.saturating_sub(explained_live);
    if before > 0 {
        let n = child(&mut tree, 0, FlameKind::Unattributed, labels.of("(allocated before recording)"));
        tree[n].live += before;
        tree[0].live += before;
    }

    flatten(&tree, &labels.names, min_share)
}

/// The tree as nodes, parents before children, the largest child first; subtrees below
/// `min_share` of the root in both values are left out (and counted).
fn flatten(tree: &[Builder], names: &[String], min_share: f64) -> FlameGraph {
    let mut out = FlameGraph { nodes: Vec::new(), min_share, nodes_left_out: 0 };
    let (root_live, root_total) = (tree[0].live.max(1) as f64, tree[0].total.max(1) as f64);
    let mut stack: Vec<(usize, Option<u32>, u16)> = vec![(0, None, 0)];
    let mut kids: Vec<usize> = Vec::new();
    while let Some((b, parent, depth)) = stack.pop() {
        let node = &tree[b];
        if b != 0 && (node.live as f64) < root_live * min_share && (node.total as f64) < root_total * min_share {
            out.nodes_left_out += 1;
            continue;
        }
        out.nodes.push(FlameNode {
            name: names[node.name as usize].clone(),
            kind: node.kind,
            parent,
            depth,
            live_at_peak_bytes: node.live,
            total_allocated_bytes: node.total,
        });
        let me = (out.nodes.len() - 1) as u32;
        kids.clear();
        kids.extend(node.children.values().copied());
        // Pushed in reverse so the largest comes out first; equal ones by name, then kind.
        kids.sort_by(|&a, &b| {
            let (a, b) = (&tree[a], &tree[b]);
            (a.total, a.live)
                .cmp(&(b.total, b.live))
                .then_with(|| names[b.name as usize].cmp(&names[a.name as usize]))
                .then(b.kind.cmp(&a.kind))
        });
        for &c in &kids {
            stack.push((c, Some(me), depth + 1));
        }
    }
    out
}

fn frame_label(trace: &Trace, f: &crate::model::Frame) -> String {
    let file = trace.str(f.filename);
    let base = file.rsplit('/').next().unwrap_or(file);
    if base.is_empty() {
        trace.str(f.name).to_owned()
    } else {
        format!("{} ({base}:{})", trace.str(f.name), f.line)
    }
}

/// For every event, the innermost operator running at its timestamp (on any thread): the
/// latest-starting op whose span contains it, `StrId(u32::MAX)` when none. Empty when the
/// trace has no operators (a memory snapshot: 4 bytes an event saved), so read it with `get`.
pub fn innermost_ops(trace: &Trace) -> Vec<StrId> {
    if trace.ops.is_empty() {
        return Vec::new();
    }
    let mut out = vec![StrId(u32::MAX); trace.events.len()];
    innermost_op_at(trace, 0..trace.events.len(), |i, op| {
        if let Some(o) = op {
            out[i] = trace.ops[o].name;
        }
    });
    out
}

/// The innermost operator running at each of `events` (indices into the trace's events,
/// best in time order): the index into [`Trace::ops`] of the latest-starting op whose span
/// contains its timestamp, on any thread, given to `found` with the event.
pub fn innermost_op_at(trace: &Trace, events: impl IntoIterator<Item = usize>, mut found: impl FnMut(usize, Option<usize>)) {
    let ev = &trace.events;
    let mut order: Vec<usize> = (0..trace.ops.len()).collect();
    order.sort_by_key(|&o| trace.ops[o].start_ns);
    let mut next = 0usize;
    // Open ops; the innermost is the latest start still open.
    let mut open: Vec<usize> = Vec::new();
    let mut last_ts = 0u64;
    for i in events {
        let ts = ev.ts_ns[i];
        if ts < last_ts {
            // Events out of time order: restart the sweep (rare; keeps the answer right).
            open.clear();
            next = 0;
        }
        last_ts = ts;
        while next < order.len() && trace.ops[order[next]].start_ns <= ts {
            open.push(order[next]);
            next += 1;
        }
        open.retain(|&o| trace.ops[o].end_ns >= ts);
        found(i, open.iter().copied().max_by_key(|&o| trace.ops[o].start_ns));
    }
}
