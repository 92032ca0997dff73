//! Allocation categories (parameter, gradient, optimizer state, ...) on real traces: PyTorch
//! snapshots of an MLP trained with Adam and a ResNet-18 trained with SGD and momentum (phases
//! and lifetimes only), and native traces with operators and tensor addresses (graph profile).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use shared::analysis::categories::{bytes_at, categorize, Categorized, Category, Rule};
use shared::analysis::summary;
use shared::model::{EventType, Phase};
use shared::Trace;
use std::collections::HashMap;
use std::path::PathBuf;

fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data")
}

fn load(name: &str) -> Trace {
    let bytes = std::fs::read(data_dir().join(name)).unwrap();
    if name.ends_with(".pickle") {
        shared::import::snapshot::import(&bytes).unwrap()
    } else {
        shared::import(&bytes, &shared::ImportOptions::default()).unwrap()
    }
}

fn facts(file: &str) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(data_dir().join(file)).unwrap()).unwrap()
}

/// Bytes of one category in a `bytes_at` answer.
fn get(bytes: &[(Category, u64)], c: Category) -> u64 {
    bytes.iter().find(|(k, _)| *k == c).map(|&(_, b)| b).unwrap()
}

/// Sizes of the allocations with this category and rule, sorted.
fn sizes(trace: &Trace, cats: &[Categorized], category: Category, rule: Rule) -> Vec<u64> {
    let mut v: Vec<u64> =
        cats.iter().filter(|c| c.category == category && c.rule == rule).map(|c| trace.events.size_bytes[c.event as usize]).collect();
    v.sort_unstable();
    v
}

/// Block sizes of a float32 MLP's weights and biases (the caching allocator rounds every
/// request up to 512 B), sorted.
fn mlp_parameter_blocks(widths: &[u64]) -> Vec<u64> {
    let mut v: Vec<u64> = widths.windows(2).flat_map(|w| [w[0] * w[1] * 4, w[1] * 4]).map(|b| b.div_ceil(512) * 512).collect();
    v.sort_unstable();
    v
}

/// `v` repeated `n` times, sorted.
fn times(v: &[u64], n: usize) -> Vec<u64> {
    let mut out: Vec<u64> = (0..n).flat_map(|_| v.iter().copied()).collect();
    out.sort_unstable();
    out
}

/// Index of the free of every allocation (the next `Free` at its address on its device).
fn frees(trace: &Trace) -> HashMap<usize, usize> {
    let ev = &trace.events;
    let mut open: HashMap<(u8, u64), usize> = HashMap::new();
    let mut out = HashMap::new();
    for i in 0..ev.len() {
        match ev.event_type(i) {
            EventType::Alloc => {
                open.insert((ev.device[i], ev.address[i]), i);
            }
            EventType::Free => {
                if let Some(a) = open.remove(&(ev.device[i], ev.address[i])) {
                    out.insert(a, i);
                }
            }
            _ => {}
        }
    }
    out
}

/// True if event `i` lies in a backward pass: the nearest events with a phase before and after
/// it (itself included) are backward events.
fn in_backward(trace: &Trace, i: usize) -> bool {
    let ev = &trace.events;
    let phased = |k: &usize| ev.phase(*k) != Phase::Other;
    let before = (0..=i).rev().find(phased).map(|k| ev.phase(k));
    let after = (i..ev.len()).find(phased).map(|k| ev.phase(k));
    before == Some(Phase::Backward) && after == Some(Phase::Backward)
}

fn last_event_of(trace: &Trace, phase: Phase) -> usize {
    (0..trace.events.len()).rev().find(|&i| trace.events.phase(i) == phase).unwrap()
}

#[test]
fn every_allocation_gets_one_entry_and_the_peak_adds_up() {
    let mut names: Vec<String> = std::fs::read_dir(data_dir()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    let mut checked = 0;
    let mut pinned_checked = 0;
    for name in names {
        let path = data_dir().join(&name);
        let is_trace = name.contains(".pickle") || name.contains(".mtrace.json") || name.ends_with("profiler_trace.json");
        if path.is_dir() || !is_trace {
            continue;
        }
        let Ok(t) = shared::import(&std::fs::read(&path).unwrap(), &shared::ImportOptions::default()) else { continue };
        let cats = categorize(&t);
        let allocs: Vec<u32> = (0..t.events.len()).filter(|&i| t.events.event_type(i) == EventType::Alloc).map(|i| i as u32).collect();
        assert_eq!(cats.iter().map(|c| c.event).collect::<Vec<_>>(), allocs, "{name}: one entry per Alloc, in order");
        for c in &cats {
            if t.devices[t.events.device[c.event as usize] as usize].is_pinned_host() {
                assert_eq!((c.category, c.rule), (Category::Other, Rule::NoRule), "{name}: pinned host event {}", c.event);
                pinned_checked += 1;
            }
        }
        let s = summary(&t);
        let at_peak = bytes_at(&t, &cats, s.peak_event_index);
        assert_eq!(at_peak.iter().map(|&(c, _)| c).collect::<Vec<_>>(), Category::ALL, "{name}");
        // The peak is one GPU's allocated total; pinned host memory is never part of it.
        assert_eq!(at_peak.iter().map(|&(_, b)| b).sum::<u64>(), s.peak_allocated_bytes, "{name}: {at_peak:?}");
        checked += 1;
    }
    assert!(checked >= 40, "{checked} traces");
    assert!(pinned_checked > 0);
}

/// MLP 512-2048-512-10 trained 3 steps with Adam (`facts.json`), recorded with stacks: the
/// model is built (`.to("cuda")`), a batch made, then each step runs forward, backward,
/// `Adam.step` and `zero_grad`; the model and optimizer are deleted before the snapshot.
#[test]
fn mlp_adam_snapshot_has_parameters_gradients_and_twice_their_size_in_adam_state() {
    let t = load("mlp_adam_3steps.pickle");
    let cats = categorize(&t);
    let params = mlp_parameter_blocks(&[512, 2048, 512, 10]);
    let param_bytes: u64 = params.iter().sum();
    assert_eq!(param_bytes, 8_419_840);

    // Alive from before the first forward to after the last step: the 6 weights and biases.
    assert_eq!(sizes(&t, &cats, Category::Parameter, Rule::AliveThroughout), params);
    // Every step's backward makes one gradient per parameter (zero_grad frees them).
    assert_eq!(sizes(&t, &cats, Category::Gradient, Rule::BackwardKeptToNextStep), times(&params, 3));
    // The first step creates exp_avg and exp_avg_sq for every parameter, kept to the end.
    assert_eq!(sizes(&t, &cats, Category::OptimizerState, Rule::OptimizerKept), times(&params, 2));

    // Activations are freed in backward.
    let free = frees(&t);
    let acts: Vec<&Categorized> = cats.iter().filter(|c| c.category == Category::Activation).collect();
    assert!(acts.len() >= 9, "{}", acts.len());
    for c in acts {
        assert_eq!(c.rule, Rule::ForwardFreedInBackward);
        assert!(in_backward(&t, free[&(c.event as usize)]), "activation {}", c.event);
    }

    // At the peak (Adam's step of the first iteration): parameters, their gradients, twice
    // their size of state, Adam's foreach temporaries (one per parameter), the batch and the
    // cuBLAS workspaces (32 MiB for forward's handle and backward's, 1 MiB for cuBLASLt).
    let s = summary(&t);
    assert_eq!(s.peak_allocated_bytes, facts("facts.json")["samples"]["mlp_adam_3steps.pickle"]["max_allocated"].as_u64().unwrap());
    let peak = bytes_at(&t, &cats, s.peak_event_index);
    assert_eq!(get(&peak, Category::Parameter), param_bytes);
    assert_eq!(get(&peak, Category::Gradient), param_bytes);
    assert_eq!(get(&peak, Category::OptimizerState), 2 * param_bytes);
    assert_eq!(get(&peak, Category::Temporary), param_bytes);
    assert_eq!(get(&peak, Category::Activation), 0);
    assert_eq!(get(&peak, Category::Buffer), 0);
    assert_eq!(get(&peak, Category::Other), 2 * 32 * 1024 * 1024 + 1024 * 1024 + 131_072 + 512);

    // After the last step (zero_grad freed the gradients): the state is twice the parameters.
    let end_of_training = bytes_at(&t, &cats, Some(last_event_of(&t, Phase::Optimizer)));
    assert_eq!(get(&end_of_training, Category::Parameter), param_bytes);
    assert_eq!(get(&end_of_training, Category::OptimizerState), 2 * param_bytes);
    assert_eq!(get(&end_of_training, Category::Gradient), 0);

    // At the end of the first backward every parameter has its gradient and no activation is
    // left.
    let first_optimizer = (0..t.events.len()).find(|&i| t.events.phase(i) == Phase::Optimizer).unwrap();
    let last_backward = (0..first_optimizer).rev().find(|&i| t.events.phase(i) == Phase::Backward).unwrap();
    let after_backward = bytes_at(&t, &cats, Some(last_backward));
    assert_eq!(get(&after_backward, Category::Gradient), param_bytes);
    assert_eq!(get(&after_backward, Category::Activation), 0);
    assert_eq!(get(&after_backward, Category::OptimizerState), 0);

    // After the model is deleted only the workspaces are left, as PyTorch reported.
    let end = bytes_at(&t, &cats, Some(t.events.len() - 1));
    assert_eq!(get(&end, Category::Other), facts("facts.json")["samples"]["mlp_adam_3steps.pickle"]["end_allocated"].as_u64().unwrap());
    assert_eq!(end.iter().map(|&(_, b)| b).sum::<u64>(), get(&end, Category::Other));

    // The same snapshot pickled with other protocols is categorized the same.
    for other in ["mlp_adam_3steps.protocol2.pickle", "mlp_adam_3steps.protocol5.pickle"] {
        assert_eq!(categorize(&load(other)), cats, "{other}");
    }
}

/// MLP 512-2048-2048-10 with Adam (`oom_facts.json`), two steps before an OOM.
#[test]
fn oom_mlp_snapshot_peak_splits_into_parameters_gradients_and_state() {
    let t = load("oom_mlp.pickle");
    let cats = categorize(&t);
    let params = mlp_parameter_blocks(&[512, 2048, 2048, 10]);
    let param_bytes: u64 = params.iter().sum();
    assert_eq!(sizes(&t, &cats, Category::Parameter, Rule::AliveThroughout), params);
    assert_eq!(sizes(&t, &cats, Category::OptimizerState, Rule::OptimizerKept), times(&params, 2));
    let s = summary(&t);
    assert_eq!(s.peak_allocated_bytes, facts("oom_facts.json")["max_allocated"].as_u64().unwrap());
    let peak = bytes_at(&t, &cats, s.peak_event_index);
    assert_eq!(get(&peak, Category::Parameter), param_bytes);
    assert_eq!(get(&peak, Category::Gradient), param_bytes);
    assert_eq!(get(&peak, Category::OptimizerState), 2 * param_bytes);
}

/// torchvision ResNet-18 (62 parameter tensors, 20 batch norms with 3 buffers each) trained
/// 2 steps with SGD and momentum; the model is built while recording.
#[test]
fn resnet18_snapshot_has_one_momentum_buffer_and_one_gradient_per_parameter() {
    let t = load("resnet18_sgd_2steps.pickle");
    let cats = categorize(&t);
    let count = |c: Category, r: Rule| cats.iter().filter(|x| x.category == c && x.rule == r).count();
    assert_eq!(count(Category::OptimizerState, Rule::OptimizerKept), 62, "one momentum buffer per parameter");
    assert_eq!(count(Category::Gradient, Rule::BackwardKeptToNextStep), 2 * 62, "one gradient per parameter per step");
    // Without operators, buffers are counted with the parameters (and so is the one batch,
    // made before the first forward and used in both steps).
    assert!(count(Category::Parameter, Rule::AliveThroughout) >= 62 + 60);
    assert_eq!(count(Category::Buffer, Rule::GraphProfile), 0);

    let free = frees(&t);
    let acts: Vec<&Categorized> = cats.iter().filter(|c| c.category == Category::Activation).collect();
    assert!(acts.len() >= 100, "{}", acts.len());
    assert!(acts.iter().all(|c| in_backward(&t, free[&(c.event as usize)])));

    let s = summary(&t);
    let f = &facts("facts.json")["samples"]["resnet18_sgd_2steps.pickle"];
    assert_eq!(s.peak_allocated_bytes, f["max_allocated"].as_u64().unwrap());
    let peak = bytes_at(&t, &cats, s.peak_event_index);
    assert!(get(&peak, Category::Parameter) > 44_000_000, "{peak:?}");
    assert!(get(&peak, Category::OptimizerState) > 44_000_000, "{peak:?}");
    // Memory from before the recording (the previous sample's workspaces) is `Other`.
    assert!(get(&peak, Category::Other) >= t.events.base_totals[0].allocated_bytes);
    let end = bytes_at(&t, &cats, Some(t.events.len() - 1));
    assert_eq!(get(&end, Category::Other), f["end_allocated"].as_u64().unwrap());
}

/// A native trace of a 2-layer Llama trained 3 iterations with Adam under AMP, with operators
/// and their tensors' addresses: the graph profile decides. `amp_llama.verify.json` holds what
/// the advice analysis found on the same trace.
#[test]
fn llama_with_operators_parameters_gradients_and_adam_state_from_the_graph_profile() {
    let t = load("amp_llama.baseline.mtrace.json.gz");
    let cats = categorize(&t);
    let s = summary(&t);
    let peak = bytes_at(&t, &cats, s.peak_event_index);
    let verified = &facts("amp_llama.verify.json")["advice"]["baseline"];
    assert_eq!(s.peak_allocated_bytes, verified["peak_allocated_bytes"].as_u64().unwrap());
    let grads = verified["gradients_bytes"].as_u64().unwrap();
    assert_eq!(get(&peak, Category::Gradient), grads);
    assert_eq!(get(&peak, Category::OptimizerState), verified["optimizer_state_bytes"].as_u64().unwrap());
    // Every parameter has its gradient, and Adam two states of its size.
    assert_eq!(get(&peak, Category::Parameter), grads);
    assert_eq!(get(&peak, Category::OptimizerState), 2 * grads);
    for c in cats.iter().filter(|c| matches!(c.category, Category::Parameter | Category::Gradient | Category::Buffer)) {
        assert_eq!(c.rule, Rule::GraphProfile, "event {}", c.event);
    }
    // The cuBLAS handles' workspaces (32 MiB, never freed, never an operator's tensor; one made
    // in forward, one in backward) are neither.
    let free = frees(&t);
    let workspaces: Vec<&Categorized> =
        cats.iter().filter(|c| t.events.size_bytes[c.event as usize] == 32 << 20 && !free.contains_key(&(c.event as usize))).collect();
    assert_eq!(workspaces.len(), 2);
    assert!(workspaces.iter().all(|c| (c.category, c.rule) == (Category::Other, Rule::NoRule)), "{workspaces:?}");
}

/// ResNet-18 under AMP with SGD and momentum, with operators: the batch norms' running
/// statistics are buffers (the optimizer never touches them); parameters and momentum buffers
/// are one per parameter tensor.
#[test]
fn resnet18_with_operators_tells_buffers_from_parameters() {
    let t = load("amp_resnet18.baseline.mtrace.json.gz");
    let cats = categorize(&t);
    let count = |c: Category| cats.iter().filter(|x| x.category == c && x.rule == Rule::GraphProfile).count();
    assert_eq!(count(Category::Parameter), 62);
    assert_eq!(count(Category::Buffer), 60);
    assert_eq!(count(Category::OptimizerState), 62);
    let s = summary(&t);
    let peak = bytes_at(&t, &cats, s.peak_event_index);
    let verified = &facts("amp_resnet18.verify.json")["advice"]["baseline"];
    assert_eq!(get(&peak, Category::OptimizerState), verified["optimizer_state_bytes"].as_u64().unwrap());
    assert!(get(&peak, Category::Activation) > get(&peak, Category::Parameter), "{peak:?}");
}

#[test]
fn category_names_are_stable() {
    let names: Vec<&str> = Category::ALL.iter().map(|c| c.as_str()).collect();
    assert_eq!(names, ["parameter", "buffer", "gradient", "activation", "optimizer_state", "temporary", "other"]);
    for c in Category::ALL {
        assert_eq!(serde_json::to_string(&c).unwrap(), format!("\"{}\"", c.as_str()));
    }
    assert_eq!(serde_json::to_string(&Rule::BackwardKeptToNextStep).unwrap(), "\"backward_kept_to_next_step\"");
}
