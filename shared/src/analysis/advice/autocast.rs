//! What bf16 autocast would allocate, replayed from the operators a full-precision trace
//! records, rather than a global halving.
//!
//! Autocast decides per operator (PyTorch's autocast op lists): *lower-precision* ops (matmul,
//! linear, convolutions, attention) run in bf16 and cast their fp32 inputs to bf16 copies;
//! *fp32* ops (softmax, norms, losses, `pow`, reductions) run in fp32 and cast bf16 inputs up;
//! everything else runs in the type its inputs promote to, so a residual stream (fp32
//! embedding plus bf16 projection) stays fp32. The replay walks the forward's operators in
//! order, carries each tensor's element size under autocast, and gives:
//!
//! - each block a size: its producer's element size under autocast over the recorded one;
//! - the copies autocast makes: of each fp32 activation a lower-precision op reads (kept for
//!   the backward when the op saves its inputs: until its backward node ran), of each bf16
//!   input an fp32 op reads, and the fp32 copy a `.float()` makes of a bf16 tensor (a no-op in
//!   the full-precision run: logits upcast for the loss) until its last reader;
//! - fused attention: an attention the full-precision run computed by its math path
//!   (`_scaled_dot_product_attention_math`: scores, softmax, masks) runs fused in bf16, which
//!   keeps only its output and the log-sum-exp (fp32, one per query row) for the backward.
//!
//! Weights' bf16 copies (cached once per forward) are [`super::weight_copies`]' part.

use super::{Block, Curve, Range};
use crate::hash::{FastMap, FastSet};
use crate::model::{OperatorEvent, Phase, TensorRef};

/// How autocast treats an operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    /// Runs in bf16: casts fp32 inputs down.
    Lower,
    /// Runs in fp32: casts bf16 inputs up.
    Full,
    /// Runs in the type its inputs promote to.
    Promote,
}

/// Ops autocast runs in bf16 (its lower-precision list, CUDA: `autocast_mode.h`), by aten
/// name; their inputs are cast, and their weights' copies cached for the forward.
pub(super) fn is_lower_precision(name: &str) -> bool {
    let n = name.strip_prefix("aten::").unwrap_or(name);
    n.starts_with("conv")
        || n.starts_with("_convolution")
        || n.starts_with("_scaled_dot_product")
        || n == "cudnn_convolution"
        || matches!(
            n,
            "addmm"
                | "addmv"
                | "addr"
                | "matmul"
                | "einsum"
                | "mm"
                | "mv"
                | "linear"
                | "addbmm"
                | "baddbmm"
                | "bmm"
                | "chain_matmul"
                | "linalg_multi_dot"
                | "prelu"
                | "lstm_cell"
                | "gru_cell"
                | "rnn_tanh_cell"
                | "rnn_relu_cell"
                | "scaled_dot_product_attention"
                | "_thnn_fused_lstm_cell"
                | "_thnn_fused_gru_cell"
        )
}

/// PyTorch's autocast lists (CUDA, `autocast_mode.h`), by aten name.
fn class_of(name: &str) -> Class {
    let n = name.strip_prefix("aten::").unwrap_or(name);
    if is_lower_precision(name) {
        return Class::Lower;
    }
    let full = matches!(
        n,
        "acos"
            | "asin"
            | "cosh"
            | "erfinv"
            | "exp"
            | "expm1"
            | "log"
            | "log10"
            | "log2"
            | "log1p"
            | "reciprocal"
            | "rsqrt"
            | "sinh"
            | "tan"
            | "pow"
            | "softplus"
            | "layer_norm"
            | "native_layer_norm"
            | "group_norm"
            | "norm"
            | "frobenius_norm"
            | "nuclear_norm"
            | "cosine_similarity"
            | "poisson_nll_loss"
            | "cosine_embedding_loss"
            | "nll_loss"
            | "nll_loss2d"
            | "hinge_embedding_loss"
            | "kl_div"
            | "l1_loss"
            | "smooth_l1_loss"
            | "huber_loss"
            | "mse_loss"
            | "margin_ranking_loss"
            | "multilabel_margin_loss"
            | "soft_margin_loss"
            | "triplet_margin_loss"
            | "multi_margin_loss"
            | "binary_cross_entropy_with_logits"
            | "dist"
            | "pdist"
            | "cdist"
            | "renorm"
            | "logsumexp"
            | "softmax"
            | "log_softmax"
            | "cumprod"
            | "cumsum"
            | "prod"
            | "sum"
            | "rms_norm"
            | "fused_rms_norm"
    );
    if full {
        Class::Full
    } else {
        Class::Promote
    }
}

/// Lower-precision ops whose backward needs their inputs (saved: the cast copies live until
/// the backward node ran).
fn saves_inputs(name: &str) -> bool {
    let n = name.strip_prefix("aten::").unwrap_or(name);
    n.starts_with("conv")
        || n.starts_with("_convolution")
        || matches!(
            n,
            "addmm" | "matmul" | "einsum" | "mm" | "linear" | "baddbmm" | "bmm" | "addbmm" | "scaled_dot_product_attention" | "prelu"
        )
        || matches!(n, "layer_norm" | "native_layer_norm" | "group_norm" | "pow" | "rms_norm" | "fused_rms_norm" | "norm")
        // Losses keep their input for the backward (nll_loss's backward takes `self`).
        || n.ends_with("_loss")
        || matches!(n, "nll_loss2d" | "kl_div" | "binary_cross_entropy_with_logits" | "cdist" | "dist" | "cosine_similarity")
}

/// fp32 ops with an optional output type (autocast's `fp32_set_opt_dtype`): run in fp32 only
/// when the caller left the type unset. Composite ops set it to their input's type (a cross
/// entropy's `log_softmax`), so there they run in the input's type.
fn sets_opt_dtype(name: &str) -> bool {
    let n = name.strip_prefix("aten::").unwrap_or(name);
    matches!(n, "prod" | "softmax" | "log_softmax" | "cumprod" | "cumsum" | "linalg_vector_norm" | "linalg_matrix_norm" | "sum")
}

/// Ops whose output takes the type their tensor inputs promote to (a residual add of an fp32
/// stream and a bf16 projection is fp32); the other unlisted ops keep their first input's type
/// (a batch norm of bf16 activations with fp32 weights is bf16).
fn promotes(name: &str) -> bool {
    let n = name.strip_prefix("aten::").unwrap_or(name);
    let n = n.strip_suffix('_').unwrap_or(n);
    matches!(
        n,
        "add"
            | "sub"
            | "rsub"
            | "mul"
            | "div"
            | "true_divide"
            | "where"
            | "maximum"
            | "minimum"
            | "cat"
            | "concat"
            | "concatenate"
            | "stack"
            | "addcmul"
            | "addcdiv"
            | "lerp"
            | "atan2"
            | "hypot"
            | "fmod"
            | "remainder"
            | "index_put"
            | "scatter_add"
            | "bitwise_and"
    )
}

/// Conversions: their output's type is the one asked for, not a promotion.
fn is_conversion(name: &str) -> bool {
    matches!(name.strip_prefix("aten::").unwrap_or(name), "to" | "_to_copy" | "type_as" | "float" | "type")
}

/// Bytes per element of a tensor as recorded (its bytes over its elements), if known.
fn elem_bytes(c: &Curve, t: &TensorRef) -> Option<u64> {
    let shape = c.trace.shapes.get(t.shape as usize)?;
    let numel: u64 = shape.iter().map(|&d| d.max(0) as u64).product();
    // A view's reference counts its whole storage: a quotient that is no element size is none.
    (numel > 0 && t.size_bytes > 0 && t.size_bytes.is_multiple_of(numel))
        .then(|| t.size_bytes / numel)
        .filter(|e| matches!(e, 1 | 2 | 4 | 8))
}

fn is_scalar(c: &Curve, t: &TensorRef) -> bool {
    c.trace.shapes.get(t.shape as usize).is_some_and(|s| s.is_empty())
}

/// What an op's outputs become under autocast, decided at its start.
#[derive(Clone, Copy)]
struct Decision {
    /// The class of the outermost listed op around it (or its own).
    decided: Option<Class>,
    /// Its inputs' promoted (or first) element size.
    promoted: Option<u64>,
    /// Called by another op (not the program).
    nested: bool,
}

/// What autocast changes in the analysed device's replay.
#[derive(Default)]
pub(super) struct Plan {
    /// Size under autocast of each block (by index in the curve's blocks), where it changes.
    pub sizes: FastMap<usize, u64>,
    /// Copies autocast makes that the full-precision run did not: `[from, to)` positions.
    pub copies: Vec<Range>,
    /// Blocks whose life autocast ends early (by index), with their new span and size: an
    /// fp32 activation that only bf16 ops read is no longer saved (their bf16 copies are), so
    /// it goes when its last reader returns.
    pub shortened: FastMap<usize, Range>,
    /// Bytes of those copies, all together, and of the attention kept by fused kernels.
    pub copy_bytes: u64,
    /// Attention calls the full-precision run computed by the math path.
    pub fused_attention: usize,
    /// Operators autocast runs in bf16 that the trace recorded.
    pub lower_ops: usize,
    /// Outputs whose element size the trace tells (by their bytes and shape): without any,
    /// the plan knows no types.
    pub typed: usize,
}

impl Plan {
    /// A block's size under autocast over its recorded life (0 for one whose life autocast
    /// shortens: [`Plan::shortened`] holds it then).
    pub fn size(&self, c: &Curve, b: &Block) -> u64 {
        let k = c.block_at[b.alloc_pos] as usize;
        if self.shortened.contains_key(&k) {
            return 0;
        }
        self.sizes.get(&k).copied().unwrap_or(b.size_bytes)
    }
}

/// Adds a copy alive from `from_ns` to `to_ns`.
fn add_copy(c: &Curve, plan: &mut Plan, from_ns: u64, to_ns: u64, bytes: u64) {
    let (from, to) = (c.pos_at_or_after(from_ns), c.pos_after(to_ns));
    if from < to && bytes > 0 {
        plan.copies.push((from, to, bytes as i64));
        plan.copy_bytes += bytes;
    }
}

/// Rounds as the caching allocator does (its default rounding: 512-byte blocks).
fn round(bytes: u64) -> u64 {
    crate::allocator::AllocatorConfig::default().round_size(bytes)
}

/// Builds the plan from the trace's forward operators; `weights` are the storages whose
/// casts [`super::weight_copies`] counts.
pub(super) fn plan(c: &Curve, weights: &FastSet<u64>) -> Plan {
    let trace = c.trace;
    // The forward's operators, and those outside every module (a loss computed on the
    // model's output), which autocast covers as well.
    let mut fwd: Vec<&OperatorEvent> = trace.ops.iter().filter(|o| matches!(o.phase, Phase::Forward | Phase::Other)).collect();
    fwd.sort_by_key(|o| (o.start_ns, std::cmp::Reverse(o.end_ns)));
    let tensors = |r: (u32, u32)| trace.tensors.get(r.0 as usize..r.1 as usize).unwrap_or(&[]);

    let lives = Lifetimes::of(trace, &fwd);
    let backward_end = |s: i64| lives.backward_end(s);

    let mut seq_inputs: FastMap<i64, Vec<(u32, u64)>> = FastMap::default();
    let mut readers: FastMap<u64, Vec<(u64, u64, Reader)>> = FastMap::default();
    let mut plan = Plan::default();
    // Open ops per thread: (end, class decided by the outermost listed ancestor, inside fused
    // attention).
    let mut open: FastMap<u64, Vec<(u64, Option<Class>, bool)>> = FastMap::default();
    // Time ranges of fused attention calls, whose inner allocations vanish, and their outputs.
    let mut fused: Vec<(u64, u64)> = Vec::new();
    let mut fused_outputs: FastSet<u64> = FastSet::default();

    let mut decisions: Vec<Option<Decision>> = vec![None; fwd.len()];
    // Each storage's element size as recorded (a slice's own bytes count its whole storage).
    let mut base_map: FastMap<u64, u64> = FastMap::default();
    let mut typed = Typed::default();
    for (k, o) in fwd.iter().enumerate() {
        typed.finish(c, &fwd, &lives, &decisions, o.start_ns, &mut plan);
        let stack = open.entry(o.thread).or_default();
        while stack.last().is_some_and(|&(end, _, _)| end < o.start_ns) {
            stack.pop();
        }
        let (listed_above, in_fused) = stack.last().map_or((None, false), |&(_, l, f)| (l, f));
        let nested = !stack.is_empty();
        let name = trace.str(o.name);
        let own = match class_of(name) {
            Class::Full if nested && sets_opt_dtype(name) => Class::Promote,
            other => other,
        };
        let decided = listed_above.or((own != Class::Promote).then_some(own));
        let ins = tensors(o.inputs);
        // What a storage's maker recorded beats what a reference (perhaps a view) suggests.
        for t in tensors(o.outputs).iter().filter(|t| !ins.iter().any(|i| i.storage_id == t.storage_id)) {
            if let Some(e) = elem_bytes(c, t) {
                base_map.insert(t.storage_id, e);
            }
        }
        let base_of = |t: &TensorRef| base_map.get(&t.storage_id).copied().or_else(|| elem_bytes(c, t));
        // Ops inside a bf16 op read its copies.
        if listed_above != Some(Class::Lower) {
            note_readers(&mut readers, o, name, ins, tensors(o.outputs), own);
        }
        let amp_elem = |elem: &FastMap<u64, u64>, t: &TensorRef| {
            let base = base_of(t);
            elem.get(&t.storage_id).copied().filter(|&e| Some(e) == base || (base == Some(4) && e == 2)).or(base)
        };
        // What the backward of this autograd number computes gradients of: its inputs' shapes
        // and types under autocast (inside a listed op, the type it casts to).
        if o.seq_nr >= 0 {
            let cast = listed_above.and(match decided {
                Some(Class::Lower) => Some(2),
                Some(Class::Full) => Some(4),
                _ => None,
            });
            let at = seq_inputs.entry(o.seq_nr).or_default();
            note_gradient_inputs(at, ins, &base_of, &|t| cast.or_else(|| amp_elem(&typed.elem, t)));
        }
        let mut fuses = false;
        if listed_above.is_none() && !in_fused {
            match own {
                Class::Lower => {
                    plan.lower_ops += 1;
                    // Fused attention where the full-precision run took the math path.
                    let math = name.ends_with("scaled_dot_product_attention")
                        && fwd[k + 1..]
                            .iter()
                            .take_while(|x| x.start_ns <= o.end_ns)
                            .any(|x| trace.str(x.name).ends_with("_scaled_dot_product_attention_math"));
                    let saved_until = if saves_inputs(name) { backward_end(o.seq_nr) } else { None };
                    let span = (o.start_ns, saved_until.unwrap_or(o.end_ns));
                    input_casts(c, &mut plan, span, ins, weights, &base_of, &|t| amp_elem(&typed.elem, t), Cast::ToBf16);
                    if math {
                        fuses = true;
                        plan.fused_attention += 1;
                        // The log-sum-exp: fp32, one per query row (batch x heads x queries).
                        let rows = ins
                            .first()
                            .and_then(|q| trace.shapes.get(q.shape as usize))
                            .map_or(0, |s| s.iter().rev().skip(1).map(|&d| d.max(0) as u64).product::<u64>());
                        add_copy(c, &mut plan, o.start_ns, saved_until.unwrap_or(o.end_ns), round(rows * 4));
                        fused.push((o.start_ns, o.end_ns));
                        fused_outputs.extend(tensors(o.outputs).iter().map(|t| t.storage_id));
                    }
                }
                Class::Full => {
                    let saved_until = if saves_inputs(name) { backward_end(o.seq_nr) } else { None };
                    let span = (o.start_ns, saved_until.unwrap_or(o.end_ns));
                    input_casts(c, &mut plan, span, ins, &FastSet::default(), &base_of, &|t| amp_elem(&typed.elem, t), Cast::ToFp32);
                }
                Class::Promote => {}
            }
        }
        // The element size of each output under autocast, decided when the op ends: an outer
        // op's decision (a convolution's) wins over its inner ones' (the `empty` it calls).
        let floats: Vec<(u64, bool)> = ins
            .iter()
            .filter(|t| t.storage_id != 0 && matches!(base_of(t), Some(2 | 4)))
            .filter_map(|t| amp_elem(&typed.elem, t).map(|e| (e, is_scalar(c, t))))
            .collect();
        let promoted = promoted_size(name, &floats);
        decisions[k] = Some(Decision { decided, promoted, nested });
        typed.ending.push(std::cmp::Reverse((o.end_ns, std::cmp::Reverse(o.start_ns), k)));
        open.entry(o.thread).or_default().push((o.end_ns, decided, in_fused || fuses));
    }

    typed.finish(c, &fwd, &lives, &decisions, u64::MAX, &mut plan);
    let mut produced = typed.produced;
    backward_types(c, &seq_inputs, &mut produced);
    size_blocks(c, &mut produced, &Fused { spans: fused, outputs: fused_outputs }, &readers, &mut plan);
    plan
}

/// The shapes and autocast element sizes (`elem`) of an op's floating inputs, once each: what
/// the backward of its autograd number computes gradients of.
fn note_gradient_inputs(
    at: &mut Vec<(u32, u64)>,
    ins: &[TensorRef],
    base_of: &dyn Fn(&TensorRef) -> Option<u64>,
    elem: &dyn Fn(&TensorRef) -> Option<u64>,
) {
    for t in ins.iter().filter(|t| matches!(base_of(t), Some(2 | 4))) {
        if let Some(e) = elem(t) {
            if !at.iter().any(|&(s, _)| s == t.shape) {
                at.push((t.shape, e));
            }
        }
    }
}

/// Which way an op casts its fp32 tensors' inputs under autocast.
#[derive(Clone, Copy, PartialEq)]
enum Cast {
    /// A bf16 op: each fp32 input autocast leaves fp32 gets a bf16 copy (half its bytes).
    ToBf16,
    /// A full-precision op: each input autocast made bf16 is copied back to fp32.
    ToFp32,
}

/// The copies an op's casts make of its inputs (once per storage, scalars and `skip` aside),
/// each live for the op's `span` (to its backward when it saves its inputs).
#[allow(clippy::too_many_arguments)]
fn input_casts(
    c: &Curve,
    plan: &mut Plan,
    span: (u64, u64),
    ins: &[TensorRef],
    skip: &FastSet<u64>,
    base_of: &dyn Fn(&TensorRef) -> Option<u64>,
    elem: &dyn Fn(&TensorRef) -> Option<u64>,
    cast: Cast,
) {
    let (from, bytes): (u64, fn(u64) -> u64) = match cast {
        Cast::ToBf16 => (4, |b| b / 2),
        Cast::ToFp32 => (2, |b| b),
    };
    let mut seen = FastSet::default();
    for t in ins {
        if t.storage_id == 0 || skip.contains(&t.storage_id) || !seen.insert(t.storage_id) || is_scalar(c, t) {
            continue;
        }
        if base_of(t) == Some(4) && elem(t) == Some(from) {
            add_copy(c, plan, span.0, span.1, round(bytes(t.size_bytes)));
        }
    }
}

/// The element sizes of the forward's outputs under autocast, decided as their ops end (an
/// outer op's decision, a convolution's, wins over its inner ones', the `empty` it calls).
#[derive(Default)]
struct Typed {
    /// Ops not yet ended: (end, Reverse(start), index in the forward's ops).
    ending: std::collections::BinaryHeap<std::cmp::Reverse<(u64, std::cmp::Reverse<u64>, usize)>>,
    /// Each storage's element size now.
    elem: FastMap<u64, u64>,
    /// Each storage's productions: (start, end, element size under autocast, recorded).
    produced: FastMap<u64, Vec<(u64, u64, u64, u64)>>,
}

impl Typed {
    /// Assigns the outputs' element sizes of the ops that ended by `until` (and counts the
    /// `.float()` copies of bf16 storages in `plan`).
    fn finish(
        &mut self,
        c: &Curve,
        fwd: &[&OperatorEvent],
        lives: &Lifetimes,
        decisions: &[Option<Decision>],
        until: u64,
        plan: &mut Plan,
    ) {
        let trace = c.trace;
        let tensors = |r: (u32, u32)| trace.tensors.get(r.0 as usize..r.1 as usize).unwrap_or(&[]);
        while let Some(&std::cmp::Reverse((end, _, k))) = self.ending.peek() {
            if end > until {
                break;
            }
            self.ending.pop();
            let o = fwd[k];
            let Some(Decision { decided, promoted, nested, .. }) = decisions[k] else { continue };
            let name = trace.str(o.name);
            let ins = tensors(o.inputs);
            for t in tensors(o.outputs) {
                let Some(base) = elem_bytes(c, t) else { continue };
                if t.storage_id == 0 {
                    continue;
                }
                plan.typed += 1;
                let same_storage = ins.iter().any(|i| i.storage_id == t.storage_id);
                // Autocast turns fp32 into bf16, nothing else: another size is a stale entry of
                // a storage freed and made again at that address.
                let current = self.elem.get(&t.storage_id).copied().filter(|&e| e == base || (base == 4 && e == 2)).unwrap_or(base);
                let new = if base != 4 {
                    base
                } else if is_conversion(name) && !nested {
                    if same_storage && current == 2 {
                        // `.float()` of what is bf16 under autocast: a copy the full-precision
                        // run did not make, alive until its last reader.
                        add_copy(c, plan, o.start_ns, lives.last_use(t.storage_id, o.end_ns), round(t.size_bytes));
                    }
                    4
                } else if same_storage {
                    // A view or an in-place op: the input's type.
                    current
                } else {
                    match decided {
                        Some(Class::Lower) => 2,
                        Some(Class::Full) => 4,
                        _ => promoted.unwrap_or(4),
                    }
                };
                self.elem.insert(t.storage_id, new);
                if !same_storage {
                    self.produced.entry(t.storage_id).or_default().push((o.start_ns, o.end_ns, new, base));
                }
            }
        }
    }
}

/// Who reads each of an op's input storages: a bf16 op casting it, a view of it, or another
/// op (which may save it for the backward).
fn note_readers(
    readers: &mut FastMap<u64, Vec<(u64, u64, Reader)>>,
    o: &OperatorEvent,
    name: &str,
    ins: &[TensorRef],
    outs: &[TensorRef],
    own: Class,
) {
    let view = !outs.is_empty() && !name.ends_with('_') && outs.iter().all(|t| ins.iter().any(|i| i.storage_id == t.storage_id));
    let kind = if own == Class::Lower {
        Reader::Cast
    } else if view {
        Reader::View
    } else {
        Reader::Other
    };
    for t in ins.iter().filter(|t| t.storage_id != 0) {
        readers.entry(t.storage_id).or_default().push((o.start_ns, o.end_ns, kind));
    }
}

/// The element size an op's outputs take under autocast from its float inputs' (element size,
/// is a scalar): the widest where the op promotes, else the first non-scalar input's.
fn promoted_size(name: &str, floats: &[(u64, bool)]) -> Option<u64> {
    let dims: Vec<u64> = floats.iter().filter(|f| !f.1).map(|f| f.0).collect();
    if promotes(name) {
        let pick = if dims.is_empty() { floats.iter().map(|f| f.0).collect() } else { dims };
        pick.into_iter().max()
    } else {
        dims.first().copied().or_else(|| floats.first().map(|f| f.0))
    }
}

/// Fused attention calls: their time ranges (in order, not overlapping), whose inner
/// allocations vanish under autocast, and their outputs, which stay.
struct Fused {
    spans: Vec<(u64, u64)>,
    outputs: FastSet<u64>,
}

/// Sets each block's size under autocast in `plan`: its producer's element size (the outermost
/// producer open at its allocation), or nothing inside a fused attention but its output; and
/// shortens the lives of fp32 blocks only cast before the backward.
fn size_blocks(
    c: &Curve,
    produced: &mut FastMap<u64, Vec<(u64, u64, u64, u64)>>,
    fused: &Fused,
    readers: &FastMap<u64, Vec<(u64, u64, Reader)>>,
    plan: &mut Plan,
) {
    // In time order, for the lookups below (a storage is made anew every iteration).
    for v in produced.values_mut() {
        v.sort_unstable_by_key(|&(s, e, _, _)| (s, std::cmp::Reverse(e)));
    }
    // Each block's size: its producer's element size (the innermost producer open at its
    // allocation), or nothing inside a fused attention but its output.
    for (k, b) in c.blocks.iter().enumerate() {
        if c.phase[b.alloc_pos] == Phase::Optimizer {
            continue;
        }
        let ts = c.ts[b.alloc_pos];
        // The outermost producer open at the allocation decided its type.
        let producer = produced.get(&b.address).and_then(|v| outermost_open(v, ts));
        // The fused kernel allocates only its output (sized below) and the log-sum-exp (a
        // copy above).
        // Fused calls come in time order and do not overlap.
        let in_fused = fused.spans.get(fused.spans.partition_point(|&(s, _)| s <= ts).wrapping_sub(1)).is_some_and(|&(_, e)| ts <= e);
        if in_fused && !fused.outputs.contains(&b.address) {
            plan.sizes.insert(k, 0);
            continue;
        }
        if let Some((_, _, new, base)) = producer {
            if new != base && base > 0 {
                plan.sizes.insert(k, round(b.size_bytes * new / base));
            }
        }
        if let Some((_, made, 4, _)) = producer {
            if let Some(end) = cast_only_until(readers, produced, b.address, made) {
                let until = c.pos_after(end);
                if b.free_pos.is_some_and(|f| until < f && c.phase[f] == Phase::Backward) {
                    let size = plan.sizes.get(&k).copied().unwrap_or(b.size_bytes);
                    plan.shortened.insert(k, (b.alloc_pos, until, size as i64));
                }
            }
        }
    }
}

/// When the forward's storages are last needed: the end of the backward of each autograd
/// sequence number, and each storage's forward reads and new productions.
struct Lifetimes {
    /// The last backward node of each autograd sequence number (saved tensors are released
    /// when it ran), sorted.
    bwd_end: Vec<(i64, u64)>,
    /// The forward ops' own sequence numbers in order, to give each op its range.
    fwd_seqs: Vec<i64>,
    /// Each storage's forward reads (ends) and new productions (starts), in time order.
    reads: FastMap<u64, Vec<u64>>,
    makes: FastMap<u64, Vec<u64>>,
}

impl Lifetimes {
    fn of(trace: &crate::model::Trace, fwd: &[&OperatorEvent]) -> Lifetimes {
        let tensors = |r: (u32, u32)| trace.tensors.get(r.0 as usize..r.1 as usize).unwrap_or(&[]);
        let mut bwd_end: Vec<(i64, u64)> =
            trace.ops.iter().filter(|o| o.phase == Phase::Backward && o.seq_nr >= 0).map(|o| (o.seq_nr, o.end_ns)).collect();
        bwd_end.sort_unstable();
        let mut fwd_seqs: Vec<i64> = fwd.iter().map(|o| o.seq_nr).filter(|&s| s >= 0).collect();
        fwd_seqs.sort_unstable();
        fwd_seqs.dedup();
        let mut reads: FastMap<u64, Vec<u64>> = FastMap::default();
        let mut makes: FastMap<u64, Vec<u64>> = FastMap::default();
        for o in fwd {
            let ins = tensors(o.inputs);
            for t in ins {
                reads.entry(t.storage_id).or_default().push(o.end_ns);
            }
            for t in tensors(o.outputs).iter().filter(|t| !ins.iter().any(|i| i.storage_id == t.storage_id)) {
                makes.entry(t.storage_id).or_default().push(o.start_ns);
            }
        }
        for v in reads.values_mut().chain(makes.values_mut()) {
            v.sort_unstable();
        }
        Lifetimes { bwd_end, fwd_seqs, reads, makes }
    }

    /// End of the backward of a forward op of sequence number `s`: its nodes have numbers
    /// from `s` up to the next forward op's.
    fn backward_end(&self, s: i64) -> Option<u64> {
        if s < 0 {
            return None;
        }
        let next = self.fwd_seqs.get(self.fwd_seqs.partition_point(|&x| x <= s)).copied().unwrap_or(i64::MAX);
        let from = self.bwd_end.partition_point(|&(q, _)| q < s);
        self.bwd_end[from..].iter().take_while(|&&(q, _)| q < next).map(|&(_, e)| e).max()
    }

    /// The last forward read of `storage` at or after `after`, before the storage is made
    /// anew (the allocator hands an address out again, iteration after iteration): how long
    /// a copy of it lives.
    fn last_use(&self, storage: u64, after: u64) -> u64 {
        let next = self.makes.get(&storage).and_then(|m| m.get(m.partition_point(|&t| t <= after)).copied()).unwrap_or(u64::MAX);
        self.reads.get(&storage).and_then(|r| r[..r.partition_point(|&t| t < next)].last().copied()).unwrap_or(after).max(after)
    }
}

/// Productions of a storage opening at most this far back are weighed (the ops making one
/// storage nest a few deep; earlier ones belong to earlier iterations).
const NESTED_PRODUCERS: usize = 64;

/// Of `made` (sorted by start, outer first among equal starts), the outermost production open
/// at `ts`: the op whose type decision holds for a block allocated then.
fn outermost_open(made: &[(u64, u64, u64, u64)], ts: u64) -> Option<(u64, u64, u64, u64)> {
    let upto = made.partition_point(|&(s, _, _, _)| s <= ts);
    made[upto.saturating_sub(NESTED_PRODUCERS)..upto]
        .iter()
        .filter(|&&(_, e, _, _)| ts <= e)
        .min_by_key(|&&(s, e, _, _)| (s, std::cmp::Reverse(e)))
        .copied()
}

/// How a forward op reads a storage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reader {
    /// A bf16 op, which reads it to cast it (and saves the copy).
    Cast,
    /// A view: reads nothing, saves nothing.
    View,
    /// Another op, which may save it for the backward.
    Other,
}

/// When the storage made at `made` (a forward op's end) is read by bf16 ops (and views)
/// alone until it is made anew: the end of its last reader. `None` when another op reads it,
/// or nothing does.
fn cast_only_until(
    readers: &FastMap<u64, Vec<(u64, u64, Reader)>>,
    produced: &FastMap<u64, Vec<(u64, u64, u64, u64)>>,
    storage: u64,
    made: u64,
) -> Option<u64> {
    let next = produced.get(&storage).and_then(|v| v.get(v.partition_point(|&(s, _, _, _)| s <= made)).map(|p| p.0)).unwrap_or(u64::MAX);
    let mut end = None;
    let mut cast = false;
    // Readers come in start order.
    let all = readers.get(&storage)?;
    let from = all.partition_point(|&(s, _, _)| s < made);
    for &(_, e, kind) in all[from..].iter().take_while(|&&(s, _, _)| s < next) {
        match kind {
            Reader::Other => return None,
            Reader::Cast => cast = true,
            Reader::View => {}
        }
        end = Some(end.map_or(e, |x: u64| x.max(e)));
    }
    end.filter(|_| cast)
}

/// Gradients take the type of what they are gradients of: each backward op's new outputs get
/// the type under autocast of the forward input of the same shape and autograd number (the
/// node's), recorded as produced.
fn backward_types(c: &Curve, seq_inputs: &FastMap<i64, Vec<(u32, u64)>>, produced: &mut FastMap<u64, Vec<(u64, u64, u64, u64)>>) {
    let trace = c.trace;
    let mut bwd: Vec<&OperatorEvent> = trace.ops.iter().filter(|o| o.phase == Phase::Backward).collect();
    bwd.sort_by_key(|o| (o.start_ns, std::cmp::Reverse(o.end_ns)));
    // Open ops per thread with the autograd number they run under.
    let mut open: FastMap<u64, Vec<(u64, i64)>> = FastMap::default();
    for o in bwd {
        let stack = open.entry(o.thread).or_default();
        while stack.last().is_some_and(|&(end, _)| end < o.start_ns) {
            stack.pop();
        }
        let seq = if o.seq_nr >= 0 { o.seq_nr } else { stack.iter().rev().map(|&(_, s)| s).find(|&s| s >= 0).unwrap_or(-1) };
        stack.push((o.end_ns, seq));
        let Some(inputs) = seq_inputs.get(&seq) else { continue };
        let ins = trace.tensors.get(o.inputs.0 as usize..o.inputs.1 as usize).unwrap_or(&[]);
        for t in trace.tensors.get(o.outputs.0 as usize..o.outputs.1 as usize).unwrap_or(&[]) {
            if t.storage_id == 0 || ins.iter().any(|i| i.storage_id == t.storage_id) || elem_bytes(c, t) != Some(4) {
                continue;
            }
            if let Some(&(_, e)) = inputs.iter().find(|&&(s, _)| s == t.shape) {
                produced.entry(t.storage_id).or_default().push((o.start_ns, o.end_ns, e, 4));
            }
        }
    }
}
