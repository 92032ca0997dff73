//! The entries' stacks entered into the trace's tables in the order the entries are replayed,
//! each with the phase and layer it names.

use super::compactor::LocalFrames;
use super::entries::Frames;
use super::view::View;
use crate::hash::FastMap as HashMap;
use crate::import::pickle::ValueId;
use crate::import::ImportError;
use crate::model::{Frame, Phase, StrId, Trace};

/// A stack in the trace's tables, with the phase and layer it names.
#[derive(Clone, Copy)]
pub(super) struct InternedStack {
    pub(super) stack: u32,
    pub(super) phase: Phase,
    pub(super) layer: StrId,
}

/// Interns the entries' stacks into the trace's tables, in the order the entries are walked.
#[derive(Default)]
pub(super) struct StackInterner {
    frames: HashMap<u32, u32>,
    stacks: HashMap<u32, InternedStack>,
    /// Frame lists that were left as values, by slot.
    values: HashMap<ValueId, u32>,
    /// Each trace frame's class, by frame id, once looked at.
    classes: Vec<Option<FrameClass>>,
}

impl StackInterner {
    pub(super) fn stack(
        &mut self,
        v: &View,
        local: &mut LocalFrames,
        trace: &mut Trace,
        frames: Frames,
        path: &dyn Fn() -> String,
    ) -> Result<InternedStack, ImportError> {
        let sid = match frames {
            Frames::Local(sid) => sid,
            Frames::Value(list) => match self.values.get(&list) {
                Some(&sid) => sid,
                None => {
                    let items = v.list(list, &path)?;
                    let mut ids = Vec::with_capacity(items.len());
                    for (i, &f) in items.iter().enumerate() {
                        let id = match local.frame(&v.p.arena, f) {
                            Some(id) => id,
                            None => {
                                // Not a frame: say what is wrong, as the walk of a frame does.
                                let fpath = || format!("{}[{i}]", path());
                                v.str(f, "name", &fpath)?;
                                v.str(f, "filename", &fpath)?;
                                return Err(v.err(&fpath, "expected a frame"));
                            }
                        };
                        ids.push(id);
                    }
                    let sid = local.stack(&ids);
                    self.values.insert(list, sid);
                    sid
                }
            },
        };
        if let Some(&s) = self.stacks.get(&sid) {
            return Ok(s);
        }
        let mut ids = Vec::with_capacity(local.stacks[sid as usize].len());
        for &lf in local.stacks[sid as usize].iter() {
            let id = match self.frames.get(&lf) {
                Some(&id) => id,
                None => {
                    let f = &local.frames[lf as usize];
                    let frame = Frame { name: trace.strings.intern(&f.name), filename: trace.strings.intern(&f.filename), line: f.line };
                    let id = trace.stacks.intern_frame(frame);
                    self.frames.insert(lf, id);
                    id
                }
            };
            ids.push(id);
        }
        let (phase, layer) = classify_stack(trace, &ids, &mut self.classes);
        let interned = InternedStack { stack: trace.stacks.intern_stack(ids), phase, layer };
        self.stacks.insert(sid, interned);
        Ok(interned)
    }
}

/// What one frame says of its stack: the phase its name or file means (`Other` if none), and
/// whether it names a layer: user code, or a module's `forward` in a library outside torch
/// (torchvision's, transformers'), which says which block of a model the stack is in.
#[derive(Clone, Copy)]
struct FrameClass {
    phase: Phase,
    user: bool,
}

impl FrameClass {
    fn of(name: &str, file: &str) -> Self {
        let phase = if name.contains("torch::autograd::Engine") || name.contains("evaluate_function") {
            Phase::Backward
        } else if file.contains("/torch/optim/") {
            Phase::Optimizer
        } else if file.contains("/torch/nn/modules/") {
            Phase::Forward
        } else {
            Phase::Other
        };
        // torch's own package (a venv may live in /opt/torch/: the package is what follows
        // site-packages), other installed packages, and the program's own files.
        let installed = file.contains("/site-packages/") || file.contains("/dist-packages/");
        let torch = if installed { file.contains("-packages/torch/") } else { file.contains("/torch/") };
        let forward = matches!(name, "forward" | "_forward_impl");
        let user = file.ends_with(".py") && !torch && (!installed || forward);
        FrameClass { phase, user }
    }
}

/// Phase and a layer name from an allocation's stack: the autograd engine means backward,
/// `torch/optim` means optimizer, `torch/nn/modules` means forward; the layer is the innermost
/// Python frame of user code or of a library model's `forward` (`file.py:line in name`,
/// [`crate::model::source_layer`]), which is what a user can act on. Each
/// frame is looked at once (`classes`, by frame id): stacks share most of their frames, and
/// these substring searches were the viewer worker's busiest wasm function as it warmed up.
fn classify_stack(trace: &mut Trace, frame_ids: &[u32], classes: &mut Vec<Option<FrameClass>>) -> (Phase, StrId) {
    let mut phase = Phase::Other;
    let mut user: Option<(StrId, StrId, u32)> = None;
    for &fid in frame_ids {
        let f = trace.stacks.frames[fid as usize];
        let i = fid as usize;
        if classes.len() <= i {
            classes.resize(i + 1, None);
        }
        let class = *classes[i].get_or_insert_with(|| FrameClass::of(trace.str(f.name), trace.str(f.filename)));
        if phase == Phase::Other {
            phase = class.phase;
        }
        if user.is_none() && class.user {
            user = Some((f.name, f.filename, f.line));
        }
    }
    let layer = match user {
        Some((n, file, line)) => {
            let label = crate::model::source_layer(trace.str(file), line, trace.str(n));
            trace.strings.intern(&label)
        }
        None => StrId::NONE,
    };
    (phase, layer)
}
