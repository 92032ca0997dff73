//! `collector trace -- python PROGRAM` on real PyTorch programs, on the CPU: layer paths,
//! backward attribution, iterations, exit codes and output passing through, DataLoader
//! workers, torch.compile, Ctrl-C, a full buffer, programs that are not what we expect, and
//! the recorder fallback (`--capture recorder`: on a CPU it records nothing and says so; its
//! collector side on real H100 snapshots).
//!
//! Needs the torch 2.11 venv's Python (`MEMORY_TRACER_PYTHON`, set by `cargo xtask`; else
//! `python3`) with torchvision and transformers, and a collector built with the `tracing`
//! feature (it carries the capture library).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod server;

mod scratch;

use scratch::Scratch;
use shared::analysis::layer_stats;
use shared::model::Phase;
use shared::{ImportOptions, Trace};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use traceio::files::load_trace;

fn python() -> String {
    std::env::var("MEMORY_TRACER_PYTHON").unwrap_or_else(|_| "python3".into())
}

fn program(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/python/programs").join(name).display().to_string()
}

fn workdir(name: &str) -> Scratch {
    Scratch::new(&format!("python-cpu-{name}"))
}

fn collector(dir: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_collector"));
    c.current_dir(dir).env_remove("MEMORY_TRACER_PYTHONPATH");
    c
}

/// Runs `collector trace -q -o DIR/out.mtrace.json FLAGS -- COMMAND` and loads the trace.
fn trace(name: &str, flags: &[&str], command: &[String]) -> (Output, Option<Trace>, Scratch) {
    let dir = workdir(name);
    let out = dir.join("out.mtrace.json");
    let output = collector(&dir).args(["trace", "-q", "-o"]).arg(&out).args(flags).arg("--").args(command).output().unwrap();
    let t = out.exists().then(|| load_trace(&out, &ImportOptions::default()).unwrap());
    (output, t, dir)
}

fn py(script: &str, args: &[&str]) -> Vec<String> {
    let mut v = vec![python(), program(script)];
    v.extend(args.iter().map(|s| s.to_string()));
    v
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn layer_names(t: &Trace) -> Vec<String> {
    layer_stats(t).into_keys().collect()
}

#[test]
fn torchvision_resnet18_training_gets_module_paths_phases_and_iterations() {
    let (out, t, _) = trace("resnet18", &[], &py("resnet18_train.py", &["--iters", "2"]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("trained 2 iterations"), "the program's stdout passes through");
    let t = t.expect("a trace");
    assert_eq!(t.iterations.len(), 2, "one iteration per optimizer step");
    let layers = layer_names(&t);
    for want in
        ["ResNet", "conv1", "bn1", "layer1.0.conv1", "layer4.1.bn2", "layer2.0.downsample.0", "fc", "CrossEntropyLoss", "optimizer.step"]
    {
        assert!(layers.iter().any(|l| l == want), "layer {want} missing from {layers:?}");
    }
    // By default only autograd nodes are recorded, and each belongs to the module whose forward
    // made it (its sequence number falls in that module's range).
    assert!(
        t.ops.iter().all(|o| t.str(o.name).ends_with("Backward0")
            || t.str(o.name).ends_with("Backward1")
            || t.str(o.name).contains("AccumulateGrad")),
        "only autograd nodes"
    );
    let conv_bw: Vec<&str> = t.ops.iter().filter(|o| t.str(o.name) == "ConvolutionBackward0").map(|o| t.str(o.layer)).collect();
    assert_eq!(conv_bw.len(), 2 * 20, "20 convolutions per iteration");
    assert!(conv_bw.iter().all(|l| l.ends_with("conv1") || l.ends_with("conv2") || l.ends_with("downsample.0")), "{conv_bw:?}");
    for phase in [Phase::Forward, Phase::Backward, Phase::Optimizer] {
        assert!((0..t.events.len()).any(|i| t.events.phase(i) == phase), "no {phase:?} allocations");
    }
    assert!(t.meta.warnings.is_empty(), "{:?}", t.meta.warnings);
    let torch = Command::new(python()).args(["-c", "import torch; print(torch.__version__)"]).output().unwrap();
    assert_eq!(t.meta.pytorch_version.as_deref(), Some(text(&torch.stdout).trim()), "the version of the torch that ran");
    assert!(shared::analysis::summary(&t).peak_allocated_bytes > 10 << 20);
}

#[test]
fn ops_all_records_every_operator_with_its_tensors_and_module() {
    let (out, t, _) = trace("ops_all", &["--ops", "all"], &py("resnet18_train.py", &["--iters", "1"]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let t = t.expect("a trace");
    let convs: Vec<_> = t.ops.iter().filter(|o| t.str(o.name) == "aten::conv2d").collect();
    assert_eq!(convs.len(), 20);
    assert!(convs.iter().all(|o| o.phase == Phase::Forward && o.inputs.1 > o.inputs.0), "forward convolutions with their input tensors");
    assert_eq!(t.str(convs[0].layer), "conv1");
    let bw: Vec<&str> = t.ops.iter().filter(|o| t.str(o.name) == "ConvolutionBackward0").map(|o| t.str(o.layer)).collect();
    assert_eq!(bw.len(), 20);
    assert_eq!(bw.last().copied(), Some("conv1"), "the first convolution's gradient comes last");
    let (out, t, _) = trace("ops_none", &["--ops", "none"], &py("resnet18_train.py", &["--iters", "1"]));
    assert!(out.status.success());
    let t = t.expect("a trace");
    assert!(t.ops.is_empty());
    assert!(layer_names(&t).iter().any(|l| l == "layer1.0.conv1"));
    let (out, _, _) = trace("ops_bad", &["--ops", "some"], &py("resnet18_train.py", &[]));
    let err = text(&out.stderr);
    assert!(err.contains("invalid value 'some' for '--ops <MODE>'") && err.contains("[possible values: all, backward, none]"), "{err}");
    assert!(!out.status.success());
}

#[test]
fn transformers_causal_lm_gets_hugging_face_module_paths() {
    let (out, t, _) = trace("hf", &[], &py("hf_causal_lm.py", &[]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let t = t.expect("a trace");
    assert_eq!(t.iterations.len(), 2);
    let stats = layer_stats(&t);
    for want in ["GPT2LMHeadModel", "transformer.wte", "transformer.h.0.attn", "transformer.h.1.mlp.c_fc", "transformer.ln_f", "lm_head"] {
        assert!(stats.contains_key(want), "layer {want} missing from {:?}", stats.keys().collect::<Vec<_>>());
    }
    // AdamW creates its state in the first step.
    assert!(stats["optimizer.step"].total_allocations > 0);
}

/// Layer of each allocation of `size` bytes in the trace.
fn layers_of_size(t: &Trace, size: u64) -> Vec<String> {
    t.memory_events()
        .filter(|e| e.event_type == shared::model::EventType::Alloc && e.size_bytes == size)
        .map(|e| e.layer_name.unwrap_or("").to_owned())
        .collect()
}

#[test]
fn lines_outside_modules_name_the_allocations_they_make() {
    let (out, t, dir) = trace("outside", &[], &py("outside_modules.py", &[]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let t = t.expect("a trace");
    let at = json_line(&out, "OUTSIDE ");
    let line = |k: &str| at[k].as_str().unwrap().to_owned();
    let python: Vec<u32> = String::from_utf8(
        Command::new(python()).args(["-c", "import sys; print(sys.version_info[0], sys.version_info[1])"]).output().unwrap().stdout,
    )
    .unwrap()
    .split_whitespace()
    .map(|v| v.parse().unwrap())
    .collect();
    if python < vec![3, 12] {
        // No sys.monitoring: said beside the layer table, and nothing named wrongly.
        assert!(t.meta.lines_unnamed.as_deref().is_some_and(|w| w.contains("3.12")), "{:?}", t.meta.lines_unnamed);
        assert!(!layer_names(&t).iter().any(|l| shared::model::is_source_layer(l)), "{:?}", layer_names(&t));
        let summary = text(&collector(&dir).args(["summary", "out.mtrace.json"]).output().unwrap().stdout);
        assert!(summary.contains("unattributed: allocations outside every module, not named by their lines (Python 3."), "{summary}");
        return;
    }
    // randn(32, 64) + 1 in prepare(): both 8 KiB tensors; logits * 3 in loss_of(): 125 KiB, as
    // is cross_entropy's log_softmax (torch's Python, named by the caller's line), and the
    // Linear's output (its module); torch.cat at the top level: 24 KiB.
    let prepare: Vec<String> = layers_of_size(&t, 32 * 64 * 4).into_iter().filter(|l| l != "Double").collect();
    assert!(prepare.len() >= 6 && prepare.iter().all(|l| *l == line("prepare")), "{prepare:?} vs {}", line("prepare"));
    let logits = layers_of_size(&t, 32 * 1000 * 4);
    for want in [line("scale"), line("loss"), "Linear".to_owned()] {
        assert!(logits.iter().filter(|l| **l == want).count() >= 3, "{want} missing from {logits:?}");
    }
    assert_eq!(layers_of_size(&t, 3 * 32 * 64 * 4), vec![line("cat")]);
    // A module of the program's own (its lines are not the caller's), then more on the line
    // that called it: the module's output, then the line's own result.
    let after = layers_of_size(&t, 32 * 16 * 4);
    assert!(after.len() == 3 && after.iter().all(|l| *l == line("after")), "{after:?} vs {}", line("after"));
    assert!(layers_of_size(&t, 32 * 64 * 4).iter().filter(|l| *l == "Double").count() == 3, "{:?}", layers_of_size(&t, 32 * 64 * 4));
    // Backward nodes take the line (or module) their forward ran in.
    for (node, want) in [("LogSoftmaxBackward0", line("loss")), ("MulBackward0", line("scale")), ("AddmmBackward0", "Linear".to_owned())] {
        let got: Vec<&str> = t.ops.iter().filter(|o| t.str(o.name) == node).map(|o| t.str(o.layer)).collect();
        assert!(got.len() >= 3 && got.iter().all(|l| *l == want), "{node}: {got:?}, not {want}");
    }
    let summary = collector(&dir).args(["summary", "out.mtrace.json"]).output().unwrap();
    let summary = text(&summary.stdout);
    assert!(summary.contains(&line("scale")) && summary.contains(&line("prepare")), "{summary}");
}

#[test]
fn two_optimizers_get_their_own_scopes_and_the_first_one_ends_iterations() {
    let (out, t, _) = trace("two_opt", &[], &py("two_optimizers.py", &[]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let t = t.expect("a trace");
    let layers = layer_names(&t);
    for want in ["optimizer.step", "optimizer1.step", "Sequential", "Sequential#2", "Sequential#2.0", "BCEWithLogitsLoss"] {
        assert!(layers.iter().any(|l| l == want), "layer {want} missing from {layers:?}");
    }
    assert_eq!(t.iterations.len(), 3);
}

#[test]
fn inference_loops_use_the_iteration_marker_or_are_one_iteration() {
    let (out, t, _) = trace("infer_marker", &["--iteration-marker", "Encoder"], &py("inference_loop.py", &[]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let t = t.expect("a trace");
    assert_eq!(t.iterations.len(), 5, "one per call of the marked module");
    assert!(t.meta.warnings.is_empty(), "{:?}", t.meta.warnings);
    assert!(layer_names(&t).iter().any(|l| l == "blocks.1.1"));

    let (_, t, _) = trace("infer_plain", &[], &py("inference_loop.py", &[]));
    let t = t.expect("a trace");
    assert_eq!(t.iterations.len(), 1);
    assert!(t.meta.warnings.iter().any(|w| w.contains("the whole run is one iteration")), "{:?}", t.meta.warnings);

    let (_, t, _) = trace("infer_bad_marker", &["--iteration-marker", "NoSuchModule"], &py("inference_loop.py", &[]));
    assert!(t.expect("a trace").meta.warnings.iter().any(|w| w.contains("`NoSuchModule`") && w.contains("never called")));
}

#[test]
fn exit_codes_stdout_and_stderr_pass_through_and_the_trace_is_kept() {
    let (out, t, _) = trace("exit3", &[], &py("exit3.py", &[]));
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(text(&out.stdout), "to stdout\n");
    assert!(text(&out.stderr).contains("to stderr"));
    let minor = Command::new(python()).args(["-c", "import torch; print('.'.join(torch.__version__.split('.')[:2]))"]).output().unwrap();
    let minor = text(&minor.stdout).trim().to_owned();
    let capture = format!("collector: capture: native (torch {minor}, library built for torch {minor}.");
    assert!(text(&out.stderr).contains(&capture), "{capture} in {}", text(&out.stderr));
    assert_eq!(t.expect("a trace").iterations.len(), 1);

    let (out, t, _) = trace("raises", &[], &py("raises.py", &[]));
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("ValueError: the program failed on purpose"));
    assert!(!t.expect("a trace").events.is_empty());
}

/// Per block of `compiled_blocks.py`, forward and backward: its allocations (of the sizes only
/// it makes: activations and their gradients, weight and bias gradients) under it, under
/// another block, and in all.
fn block_shares(t: &Trace, facts: &serde_json::Value) -> Vec<[[u32; 2]; 3]> {
    let batch = facts["batch"].as_u64().unwrap();
    let width = facts["width"].as_u64().unwrap();
    let hidden: Vec<u64> = facts["hidden"].as_array().unwrap().iter().map(|h| h.as_u64().unwrap()).collect();
    let block_of = |layer: &str| -> Option<usize> { layer.strip_prefix("blocks.")?.split('.').next()?.parse().ok() };
    hidden
        .iter()
        .enumerate()
        .map(|(i, &h)| {
            let sizes = [batch * h * 4, h * width * 4, h * 4];
            let mut r = [[0u32; 2]; 3];
            for k in 0..t.events.len() {
                let phase = t.events.phase(k);
                if t.events.event_type(k) != shared::model::EventType::Alloc || !matches!(phase, Phase::Forward | Phase::Backward) {
                    continue;
                }
                if !sizes.contains(&t.events.size_bytes[k]) {
                    continue;
                }
                let p = usize::from(phase == Phase::Backward);
                r[2][p] += 1;
                match block_of(t.str(t.events.layer[k])) {
                    Some(b) if b == i => r[0][p] += 1,
                    Some(_) => r[1][p] += 1,
                    None => {}
                }
            }
            r
        })
        .collect()
}

/// A compiled model whose four blocks each make sizes no other block makes: at least 90 % of
/// each block's forward and backward allocations of those sizes land under that block, with
/// Inductor's caches cold and warm (the second run's code comes from the cache), default and
/// `fullgraph=True`; a compiled function with no module in it is counted as such, and the
/// summary says so. Code an untraced run compiled, found in the caches by a traced run that
/// cannot read its modules anywhere, lands on the compiled module, never on another block.
#[test]
fn compiled_code_is_attributed_to_the_modules_it_came_from() {
    let cache = workdir("inductor_cache");
    let cache_env = format!("TORCHINDUCTOR_CACHE_DIR={}", cache.display());
    for (name, args) in [("compiled_cold", &[][..]), ("compiled_warm", &["--fullgraph", "--bare"][..])] {
        let mut command = vec!["env".to_owned(), cache_env.clone()];
        command.extend(py("compiled_blocks.py", args));
        let (out, t, dir) = trace(name, &[], &command);
        assert!(out.status.success(), "{name}: {}", text(&out.stderr));
        let t = t.expect("a trace");
        let facts: serde_json::Value = serde_json::from_str(text(&out.stdout).trim().lines().last().unwrap()).unwrap();
        let compiled = t.meta.compiled.clone().unwrap_or_else(|| panic!("{name}: no compiled code in the meta"));
        assert!(compiled.graphs >= 2, "{name}: {compiled:?}");
        for (i, [inside, _, all]) in block_shares(&t, &facts).into_iter().enumerate() {
            for (p, phase) in ["forward", "backward"].iter().enumerate() {
                assert!(all[p] > 0, "{name}: no {phase} allocations of blocks.{i}'s sizes");
                assert!(
                    inside[p] * 10 >= all[p] * 9,
                    "{name}: {phase}: {} of {} allocations of blocks.{i}'s sizes under it",
                    inside[p],
                    all[p]
                );
            }
            assert!(compiled.modules.contains(&format!("blocks.{i}.up")), "{name}: {compiled:?}");
        }
        if args.contains(&"--bare") {
            assert!(compiled.unresolved > 0, "{name}: a compiled function with no module was attributed: {compiled:?}");
        } else {
            assert!(compiled.unresolved * 10 <= compiled.sites, "{name}: {compiled:?}");
        }
        let summary = collector(&dir).args(["summary"]).arg(dir.join("out.mtrace.json")).output().unwrap();
        let summary = text(&summary.stdout);
        assert!(summary.contains("compiled code      ") && summary.contains("Inductor graph"), "{name}: {summary}");
        assert!(summary.contains("blocks.") && summary.contains("* includes allocations of torch.compile'd code"), "{name}: {summary}");
    }
    // Compiled by an untraced run into fresh caches, then traced with no remembered modules.
    let cache = workdir("inductor_cache_untraced");
    let remembered = workdir("no_remembered_modules");
    let plain = Command::new(python())
        .arg(program("compiled_blocks.py"))
        .env("TORCHINDUCTOR_CACHE_DIR", &*cache)
        .env_remove("PYTHONPATH")
        .output()
        .unwrap();
    assert!(plain.status.success(), "{}", text(&plain.stderr));
    let command =
        ["env".to_owned(), format!("TORCHINDUCTOR_CACHE_DIR={}", cache.display()), format!("XDG_CACHE_HOME={}", remembered.display())]
            .into_iter()
            .chain(py("compiled_blocks.py", &[]))
            .collect::<Vec<_>>();
    let (out, t, _) = trace("compiled_untraced_cache", &[], &command);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&plain.stdout), text(&out.stdout), "the traced run's results differ from the untraced one's");
    let t = t.expect("a trace");
    let facts: serde_json::Value = serde_json::from_str(text(&out.stdout).trim().lines().last().unwrap()).unwrap();
    let cache_on = autograd_cache_on();
    for (i, [inside, elsewhere, all]) in block_shares(&t, &facts).into_iter().enumerate() {
        assert_eq!(elsewhere, [0, 0], "blocks.{i}'s allocations attributed to another block");
        // The backward too where the capture bypasses AOTAutograd's cache (torch 2.11 on: the
        // cache handed back backward code without its graph). Torch 2.6 has no such cache on,
        // and 9 of its 12 backward allocations per block land under the block (not yet found).
        let phases = if cache_on { 2 } else { 1 };
        for (p, phase) in ["forward", "backward"].iter().enumerate().take(phases) {
            assert!(
                all[p] > 0 && inside[p] * 10 >= all[p] * 9,
                "{phase}: {} of {} allocations of blocks.{i}'s sizes under it",
                inside[p],
                all[p]
            );
        }
    }
    let compiled = t.meta.compiled.expect("compiled code in the meta");
    if cache_on {
        assert_eq!(compiled.unresolved, 0, "AOTAutograd's cache bypassed, every site names its module: {compiled:?}");
    }
}

/// Whether this torch turns AOTAutograd's cache on by default (2.11 and 2.15 do, 2.6 does not).
fn autograd_cache_on() -> bool {
    let probe = "import torch._functorch.config as c; print(bool(getattr(c, 'enable_autograd_cache', False)))";
    let out = Command::new(python()).args(["-c", probe]).output().unwrap();
    text(&out.stdout).trim() == "True"
}

/// The JSON a program printed on a line of its own after `prefix` (`PARITY `: what
/// `compile_parity.py CASE` prints: results, dynamo's counters, its warnings).
fn json_line(out: &Output, prefix: &str) -> serde_json::Value {
    let stdout = text(&out.stdout);
    let line =
        stdout.lines().find_map(|l| l.strip_prefix(prefix)).unwrap_or_else(|| panic!("no {prefix}line: {stdout}\n{}", text(&out.stderr)));
    serde_json::from_str(line).unwrap()
}

fn parity(out: &Output) -> serde_json::Value {
    json_line(out, "PARITY ")
}

/// The tracer never changes what torch.compile does: for a module compiled with and without
/// `fullgraph=True`, a compiled function calling modules, `Module.compile()`, a model compiled
/// before a tracer starts, training, a break the program makes itself, and `torch.export`,
/// with dynamo imported before the first module call and after, traced and untraced runs give
/// the same results, the same graph breaks (only the program's own), unique graphs, recompiles,
/// compiled frames and captured calls, and dynamo warns of nothing.
#[test]
fn torch_compile_and_export_behave_the_same_traced_and_untraced() {
    // Every case with dynamo imported early, through AOTAutograd without Inductor's C++
    // compile (what dynamo does is the same); the crash the tracer once caused, with Inductor
    // and dynamo imported late; training (forward, backward, the optimizer step) through
    // Inductor's generated code, in default mode and with fullgraph=True, the traced run
    // finding Inductor's caches warm from the untraced one.
    for (cases, backend) in
        [(&["all"][..], "aot_eager"), (&["module_fullgraph"][..], "inductor"), (&["train", "train_fullgraph"][..], "inductor")]
    {
        let case = cases.join("+");
        let args: Vec<&str> = cases.iter().copied().chain(["--backend", backend]).collect();
        let plain = Command::new(python()).arg(program("compile_parity.py")).args(&args).env_remove("PYTHONPATH").output().unwrap();
        assert!(plain.status.success(), "{case} untraced: {}", text(&plain.stderr));
        let (traced, t, _) = trace(&format!("parity_{}", cases[0]), &[], &py("compile_parity.py", &args));
        assert!(traced.status.success(), "{case} traced failed where untraced ran: {}", text(&traced.stderr));
        let (plain, traced_json) = (parity(&plain), parity(&traced));
        assert_eq!(plain, traced_json, "{case}: untraced (left) and traced (right) differ");
        // The one break the program makes itself (`graph_break`), and no other.
        assert_eq!(plain["counters"]["graph_breaks"], u64::from(case == "all"), "{case}: {plain}");
        for c in cases.iter().filter(|c| c.starts_with("train")) {
            assert!(plain[c].as_f64().is_some_and(f64::is_finite), "{case}: no result for {c}: {plain}");
        }
        assert!(!text(&traced.stderr).contains("Dynamo does not know"), "{case}: {}", text(&traced.stderr));
        assert!(!t.expect("a trace").events.is_empty(), "{case}: nothing traced");
    }
    // Compiled and run before the MemoryTracer API starts, then run while it traces.
    let dir = workdir("parity_api");
    let package = collector(&dir).args(["python-package", "--out"]).arg(dir.join("pkg")).output().unwrap();
    assert!(package.status.success(), "{}", text(&package.stderr));
    let args = ["api_after_compile", "--backend", "aot_eager"];
    let plain = Command::new(python()).arg(program("compile_parity.py")).args(args).env_remove("PYTHONPATH").output().unwrap();
    let api = Command::new(python())
        .arg(program("compile_parity.py"))
        .args(args)
        .env("PYTHONPATH", dir.join("pkg"))
        .env("MEMORY_TRACER_COLLECTOR", env!("CARGO_BIN_EXE_collector"))
        .output()
        .unwrap();
    assert!(api.status.success(), "{}", text(&api.stderr));
    assert!(text(&api.stdout).contains("TRACED 1"), "the API did not trace: {}", text(&api.stdout));
    assert_eq!(parity(&plain), parity(&api), "compiled before the API started: untraced (left) and traced (right) differ");
}

/// A mixture of experts whose batch sizes, expert loads and held outputs depend on the data,
/// with dropped batches: the 64 KiB a leaking variant keeps per iteration is found whatever
/// the totals at iteration ends do, and the clean variant is never called a leak.
#[test]
fn leaks_are_found_in_data_dependent_loops_and_clean_ones_are_clean() {
    let (out, t, _) = trace("moe_leak", &[], &py("moe_loop.py", &["--leak"]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let r = shared::analysis::leaks::leaks(&t.expect("a trace"), 5);
    assert!(r.leaking, "{}: {:?} {:?}", r.verdict, r.allocated_low_bytes, r.kept_per_iteration_bytes);
    assert_eq!(r.growth_per_iteration_bytes, 64 * 1024, "{}", r.verdict);
    let (out, t, _) = trace("moe_clean", &[], &py("moe_loop.py", &[]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let r = shared::analysis::leaks::leaks(&t.expect("a trace"), 5);
    assert!(!r.leaking, "a clean loop called a leak: {}: {:?} {:?}", r.verdict, r.allocated_low_bytes, r.kept_per_iteration_bytes);
    // Each iteration keeps its input batch, whose size follows the data: a leak, with its range.
    let (out, t, _) = trace("moe_leak_varying", &[], &py("moe_loop.py", &["--leak-varying"]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let r = shared::analysis::leaks::leaks(&t.expect("a trace"), 5);
    assert!(r.leaking, "{}: {:?} {:?}", r.verdict, r.allocated_low_bytes, r.kept_per_iteration_bytes);
    let kept: Vec<u64> = r.kept_per_iteration_bytes[r.warmup..r.kept_per_iteration_bytes.len() - 1].to_vec();
    let (lo, hi) = (kept.iter().min().copied().unwrap(), kept.iter().max().copied().unwrap());
    assert!(lo >= 24 * 1024 && hi <= 200 * 1024 && hi > lo, "{kept:?}");
    let range = format!("leak: {}–{} per iteration", shared::units::format_bytes(lo), shared::units::format_bytes(hi));
    assert!(r.verdict.starts_with(&range), "{} (want {range})", r.verdict);
}

#[test]
fn dataloader_workers_are_not_traced_and_do_not_break_capture() {
    let (out, t, dir) = trace("workers", &[], &py("dataloader_workers.py", &[]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(t.expect("a trace").iterations.len(), 4);
    let files: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.file_name()).collect();
    assert_eq!(files.len(), 1, "one trace for the one training process: {files:?}");
    // Spawned workers are fresh interpreters that run the bootstrap again: still one trace.
    let (out, t, dir) = trace("workers_spawn", &[], &py("dataloader_workers.py", &["spawn"]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(t.expect("a trace").iterations.len(), 4);
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
}

#[test]
fn a_full_buffer_drops_and_counts_records_instead_of_growing() {
    let (out, t, _) = trace("busy", &["--buffer-records", "1", "--drain-interval-ms", "5000"], &py("busy.py", &[]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let t = t.expect("a trace");
    assert!(t.dropped_events > 0);
    assert!(t.meta.warnings.iter().any(|w| w.contains("dropped because the program recorded faster")), "{:?}", t.meta.warnings);
}

#[test]
fn commands_that_trace_nothing_say_so() {
    let dir = workdir("not_python");
    let out = collector(&dir).args(["trace", "-q", "--", "sh", "-c", "exit 0"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "success of the command but nothing traced");
    assert!(text(&out.stderr).contains("nothing was traced"));
    let out = collector(&dir).args(["trace", "-q", "--", "sh", "-c", "exit 5"]).output().unwrap();
    assert_eq!(out.status.code(), Some(5));
    let out = collector(&dir).args(["trace", "-q", "--", "no-such-program-xyz"]).output().unwrap();
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("cannot run `no-such-program-xyz`: no such program"));
    let out = collector(&dir).args(["trace", "-q", "--", &python(), "-I", "-c", "import torch"]).output().unwrap();
    assert!(text(&out.stderr).contains("nothing was traced"), "-I ignores PYTHONPATH: {}", text(&out.stderr));
}

#[test]
fn ctrl_c_stops_the_program_and_the_trace_is_written() {
    use std::io::BufRead;
    use std::os::unix::process::CommandExt;
    let dir = workdir("ctrl_c");
    let out = dir.join("out.mtrace.json");
    let mut cmd = collector(&dir);
    cmd.args(["trace", "-q", "-o"]).arg(&out).arg("--").args(py("long_loop.py", &[])).process_group(0);
    // A shell that started this test in the background may have left SIGINT ignored, which
    // the program would inherit (and rightly keep); a terminal's foreground job has it.
    // SAFETY: signal(2) is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            Ok(())
        });
    }
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut steps = 0;
    while steps < 5 {
        let line = lines.next().expect("the program stopped early").unwrap();
        steps += usize::from(line.starts_with("step "));
    }
    // Ctrl-C in a terminal signals the whole foreground group.
    // SAFETY: kill(2) on the group of our own child.
    unsafe { libc::kill(-(child.id() as i32), libc::SIGINT) };
    let status = child.wait().unwrap();
    let stderr = std::io::read_to_string(child.stderr.take().unwrap()).unwrap();
    assert_eq!(status.code(), Some(130), "{stderr}");
    assert!(stderr.contains("KeyboardInterrupt") && stderr.contains("interrupted"), "{stderr}");
    let t = load_trace(&out, &ImportOptions::default()).unwrap();
    assert!(t.iterations.len() >= 5, "{} iterations", t.iterations.len());
}

#[test]
fn progress_json_streams_memory_and_ends_with_the_answer() {
    let (out, _, _) = trace("progress", &["--progress-json"], &py("two_optimizers.py", &[]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let lines: Vec<serde_json::Value> =
        text(&out.stdout).lines().filter(|l| l.starts_with('{')).map(|l| serde_json::from_str(l).unwrap()).collect();
    let kinds: Vec<&str> = lines.iter().filter_map(|l| l.get("kind").or(l.get("type")).and_then(|k| k.as_str())).collect();
    assert!(!lines.is_empty(), "{}", text(&out.stdout));
    let last = lines.last().unwrap().to_string();
    assert!(last.contains("peak_allocated_bytes"), "{last} ({kinds:?})");
    assert!(lines.iter().any(|l| l.to_string().contains("\"points\"")), "live memory points");
}

#[test]
fn serve_stores_the_trace_in_a_running_server() {
    let dir = workdir("serve");
    let srv = server::Server::start(&dir.join("data"), &["--token", "s3cret"]);
    let (out, t, _) = trace("serve_client", &["--serve", &srv.base, "--serve-token", "s3cret"], &py("exit3.py", &[]));
    assert_eq!(out.status.code(), Some(3));
    let err = text(&out.stderr);
    let link = |marker: &str| {
        let line = err.lines().find(|l| l.contains(marker)).unwrap_or_else(|| panic!("no `{marker}` link in {err}"));
        line.split(marker).nth(1).and_then(|r| r.split('&').next()).unwrap().to_owned()
    };
    let (followed, id) = (link("?follow="), link("?trace="));
    assert_eq!(followed, id, "the live trace is the stored one");
    let (status, stored) = srv.get_json(&format!("/api/trace/{id}"));
    assert_eq!(status, 200);
    let events = stored["trace"]["events"]["ts_ns"].as_array().map_or(0, Vec::len);
    assert_eq!(events, t.expect("a trace").events.len());
    // Followers saw the run's memory while it ran, then its end.
    let (status, sse) = srv.get(&format!("/api/trace/{id}/events"));
    assert_eq!(status, 200);
    assert!(sse.contains("event: memory") && sse.contains("event: done"), "{sse}");
    let (_, jobs) = srv.get_json("/api/jobs");
    assert!(jobs.to_string().contains(&format!("\"trace_id\":\"{id}\"")) && jobs.to_string().contains("\"state\":\"done\""), "{jobs}");
    for flags in [vec!["--serve", &srv.base, "--serve-token", "wrong"], vec!["--serve", &srv.base]] {
        let (out, t, _) = trace("serve_refused", &flags, &py("exit3.py", &[]));
        assert!(text(&out.stderr).contains("refused the trace (401)"), "{}", text(&out.stderr));
        assert!(t.is_some(), "the local trace is kept");
    }
}

fn torchrun(args: &[&str]) -> Vec<String> {
    let mut v = vec![python(), "-m".into(), "torch.distributed.run".into(), "--standalone".into(), "--nproc-per-node".into(), "2".into()];
    v.extend(args.iter().map(|s| s.to_string()));
    v
}

/// Where each iteration of `rank` ends in a merged trace (its optimizer steps), in ns.
fn iteration_ends(merged: &Trace, rank: u32) -> Vec<u64> {
    let own = shared::ranks::rank_trace(merged, rank).expect("the rank");
    shared::analysis::iterations::spans(&own).spans.iter().map(|s| s.end_ns).collect()
}

/// torchrun: every rank is traced into its own file and the ranks are merged into the
/// output, one device per rank, each with its own trace's peak, on one clock: rank 1
/// starts 1.5 s late, yet both ranks end each iteration together (the all-reduce).
#[test]
fn torchrun_ranks_are_traced_merged_and_aligned() {
    // `-o run/`: the folder gets the merged trace and one file per rank, named after the script.
    let dir = workdir("torchrun");
    let out = collector(&dir).args(["trace", "-q", "-o", "run/", "--"]).args(torchrun(&[&program("ddp_train.py")])).output().unwrap();
    let names: std::collections::BTreeSet<String> =
        std::fs::read_dir(dir.join("run")).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    let expected: std::collections::BTreeSet<String> =
        ["ddp_train.mtrace.json", "ddp_train.rank0.mtrace.json", "ddp_train.rank1.mtrace.json"].map(String::from).into();
    assert_eq!(names, expected);
    for (from, to) in [
        ("ddp_train.mtrace.json", "out.mtrace.json"),
        ("ddp_train.rank0.mtrace.json", "out.rank0.mtrace.json"),
        ("ddp_train.rank1.mtrace.json", "out.rank1.mtrace.json"),
    ] {
        std::fs::rename(dir.join("run").join(from), dir.join(to)).unwrap();
    }
    let t = load_trace(&dir.join("out.mtrace.json"), &ImportOptions::default()).unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let merged = t;
    let peaks = shared::analysis::device_peaks(&merged);
    let ranks: Vec<(Option<u32>, &str)> = peaks.iter().map(|p| (p.rank, p.device.as_str())).collect();
    assert_eq!(ranks, [(Some(0), "cpu:0 (rank 0)"), (Some(1), "cpu:0 (rank 1)")]);
    for (rank, p) in peaks.iter().enumerate() {
        let own = load_trace(&dir.join(format!("out.rank{rank}.mtrace.json")), &ImportOptions::default()).unwrap();
        assert_eq!(p.peak_allocated_bytes, shared::analysis::summary(&own).peak_allocated_bytes, "rank {rank}");
        assert_eq!(own.meta.rank_var(shared::model::RankVar::Rank), Some(rank as u64));
        assert!(own.meta.job.as_deref().is_some_and(|j| j.contains('@')), "{:?}", own.meta.job);
    }
    assert_eq!(merged.iterations.len(), 2);
    assert!(layer_names(&merged).iter().any(|l| l == "module.0"), "DDP's module paths");
    let (e0, e1) = (iteration_ends(&merged, 0), iteration_ends(&merged, 1));
    assert_eq!((e0.len(), e1.len()), (2, 2));
    for (a, b) in e0.iter().zip(&e1) {
        assert!(a.abs_diff(*b) < 500_000_000, "iteration ends {e0:?} and {e1:?} should line up");
    }
    assert!(merged.meta.missing_ranks.is_empty() && merged.meta.warnings.is_empty(), "{:?}", merged.meta.warnings);
}

/// The built-in models under torchrun (`python -m memory_tracer.zoo`), DDP and FSDP2 on gloo:
/// each rank's peak is its own trace's, and FSDP2's sharded parameters, gradients and AdamW
/// state leave every rank's peak below DDP's.
#[test]
fn zoo_models_run_with_ddp_and_fsdp2_and_fsdp2_peaks_lower() {
    let mut peaks = Vec::new();
    for strategy in ["ddp", "fsdp"] {
        let cmd = torchrun(&[
            "-m",
            "memory_tracer.zoo",
            "--model",
            "mlp",
            "--strategy",
            strategy,
            "--device",
            "cpu",
            "--iterations",
            "3",
            "--optimizer",
            "adamw",
        ]);
        let (out, t, dir) = trace(&format!("zoo_{strategy}"), &[], &cmd);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let merged = t.expect("the merged trace");
        let p = shared::analysis::device_peaks(&merged);
        assert_eq!(p.len(), 2, "{p:?}");
        for (rank, d) in p.iter().enumerate() {
            let own = load_trace(&dir.join(format!("out.rank{rank}.mtrace.json")), &ImportOptions::default()).unwrap();
            assert_eq!(d.peak_allocated_bytes, shared::analysis::summary(&own).peak_allocated_bytes);
            assert_eq!(own.iterations.len(), 3, "{strategy} rank {rank}");
        }
        peaks.push(p.iter().map(|d| d.peak_allocated_bytes).max().unwrap_or(0));
    }
    // MLP 784-1024-1024-1024-1000, AdamW: ~3.9 M parameters (15.6 MB) with gradients and two
    // state tensors each; two ranks hold half of them each under FSDP2. DDP's peak is the same
    // every run (87 MB); FSDP2's depends on how gloo's all-gathers and reduce-scatters overlap
    // on a loaded CPU (55-78 MB seen), so the margin is 5 %, not what an idle machine shows.
    assert!(peaks[1] * 100 < peaks[0] * 95, "FSDP2 {} B should be below DDP {} B", peaks[1], peaks[0]);
}

/// A rank that never starts: the other rank's trace is kept and the merged trace names the
/// missing rank and why. A rank killed mid-run: its trace until then is kept and flagged.
#[test]
fn a_rank_that_dies_is_named_and_the_others_are_kept() {
    let (out, t, dir) = trace("rank_never_starts", &[], &torchrun(&[&program("dying_rank.py"), "--when", "start"]));
    assert_ne!(out.status.code(), Some(0), "torchrun reports the failed rank");
    let merged = t.unwrap_or_else(|| panic!("a merged trace of rank 0: {}", text(&out.stderr)));
    assert_eq!(shared::ranks::ranks(&merged), [0]);
    assert_eq!(merged.meta.missing_ranks, [1]);
    assert!(
        merged.meta.warnings.iter().any(|w| w.starts_with("rank 1 of 2 is missing: its process streamed no trace")),
        "{:?}",
        merged.meta.warnings
    );
    assert!(text(&out.stderr).contains("rank 1 is missing from the merged trace"), "{}", text(&out.stderr));
    assert!(dir.join("out.rank0.mtrace.json").exists());

    let (out, t, _) = trace("rank_killed", &[], &torchrun(&[&program("dying_rank.py"), "--when", "step"]));
    assert_ne!(out.status.code(), Some(0));
    let merged = t.unwrap_or_else(|| panic!("a merged trace: {}", text(&out.stderr)));
    assert_eq!(shared::ranks::ranks(&merged), [0, 1]);
    assert!(
        merged.meta.warnings.iter().any(|w| w.starts_with("rank 1: the process ended without closing its capture")),
        "{:?}",
        merged.meta.warnings
    );
    let rank1 = shared::ranks::rank_trace(&merged, 1).unwrap();
    // The job's iterations: rank 0 finished one, then waited for rank 1 in the next.
    assert_eq!(shared::analysis::iterations::spans(&rank1).spans.len(), 1);
    assert!(!rank1.events.is_empty());
}

/// `collector serve` runs a built-in model under torchrun (`"world_size": 2`, FSDP2 on the
/// CPU): the stored trace has both ranks, the job row says so, and followers get each rank's
/// memory.
#[test]
fn serve_runs_distributed_jobs_and_streams_every_rank() {
    let dir = workdir("serve_distributed");
    let srv = server::Server::start(&dir.join("data"), &[]);
    let body = serde_json::json!({"model_name": "mlp", "world_size": 2, "strategy": "fsdp", "iterations": 2, "device": "cpu", "optimizer": "adamw"});
    let (status, done) = srv.post_json("/api/trace/memory", &body);
    assert_eq!(status, 200, "{done}");
    let id = done["trace_id"].as_str().unwrap().to_owned();
    let (_, stored) = srv.get_json(&format!("/api/trace/{id}"));
    let ranks: Vec<u64> =
        stored["trace"]["devices"].as_array().unwrap_or_else(|| panic!("{stored}")).iter().filter_map(|d| d["rank"].as_u64()).collect();
    assert_eq!(ranks, [0, 1], "{}", stored["trace"]["devices"]);
    let (_, jobs) = srv.get_json("/api/jobs");
    let row = jobs["jobs"].as_array().unwrap_or_else(|| panic!("{jobs}")).iter().find(|r| r["trace_id"] == id.as_str()).unwrap().clone();
    assert_eq!((row["world_size"].as_u64(), row["strategy"].as_str()), (Some(2), Some("fsdp")), "{row}");
    let (_, sse) = srv.get(&format!("/api/trace/{id}/events"));
    for rank in [0, 1] {
        assert!(sse.contains(&format!("\"rank\":{rank}")), "memory of rank {rank} in {sse}");
    }
    for (bad, why) in [
        (serde_json::json!({"model_name": "mlp", "world_size": 2, "strategy": "zero3", "device": "cpu"}), "expected `ddp` or `fsdp`"),
        (serde_json::json!({"model_name": "mlp", "strategy": "ddp", "device": "cpu"}), "needs `world_size` of 2 or more"),
        (serde_json::json!({"model_name": "mlp", "world_size": 99, "device": "cpu"}), "must be between 1 and 8"),
    ] {
        let (status, e) = srv.post_json("/api/trace/memory", &bad);
        assert_eq!(status, 422, "{e}");
        assert!(e.to_string().contains(why), "{e}");
    }
}

/// A module that keeps a 128 KiB copy of its input every step: `collector leaks` finds the
/// steady growth and names the module; a training loop without one finds none.
#[test]
fn leaks_are_found_and_named_and_clean_loops_are_clean() {
    let (out, t, dir) = trace("leaky", &[], &py("leaky.py", &[]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let t = t.expect("a trace");
    let r = shared::analysis::leaks::leaks(&t, 5);
    assert_eq!((r.iterations, r.warmup), (6, 1));
    assert!(r.leaking, "{}", r.verdict);
    assert_eq!(r.growth_per_iteration_bytes, 128 * 256 * 4, "{:?}", r.allocated_at_end_bytes);
    let top = &r.survivors[0];
    assert_eq!(
        (top.layer.as_str(), top.iterations, top.bytes_per_iteration as u64),
        ("Sequential.2", 5, 128 * 256 * 4),
        "{:?}",
        r.survivors
    );
    let cli = collector(&dir).args(["leaks"]).arg(dir.join("out.mtrace.json")).output().unwrap();
    assert!(text(&cli.stdout).contains("leak: allocated memory grows by 128.00 KiB per iteration"), "{}", text(&cli.stdout));

    let (_, t, _) = trace("not_leaky", &[], &py("resnet18_train.py", &["--iters", "4"]));
    let r = shared::analysis::leaks::leaks(&t.expect("a trace"), 5);
    assert!(!r.leaking && r.verdict.starts_with("no steady growth"), "{}", r.verdict);
}

/// `collector advise --verify`: the built-in ResNet-18 (batch 1, the CPU) traced as it is,
/// advised, and traced again with the top checkpointing suggestion, AMP and both: every run
/// measured, checkpointing lowers the peak, and every prediction is within 10 % of the run.
#[test]
fn advise_verify_runs_the_suggestions_and_compares_predictions_with_runs() {
    let dir = workdir("advise_verify");
    let out = collector(&dir)
        .args([
            "advise",
            "--verify",
            "--json",
            "--model",
            "resnet18",
            "--batch-size",
            "1",
            "--device",
            "cpu",
            "--iterations",
            "3",
            "--out-dir",
        ])
        .arg(dir.join("runs"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = v["rows"].as_array().unwrap();
    let names: Vec<&str> = rows.iter().map(|r| r["configuration"].as_str().unwrap()).collect();
    assert_eq!(names.len(), 4, "{names:?}");
    assert!(
        names[0] == "baseline" && names[1].starts_with("checkpoint ") && names[2] == "amp" && names[3].ends_with(" + amp"),
        "{names:?}"
    );
    let peak = |k: usize| rows[k]["peak_allocated_bytes"].as_u64().unwrap_or_else(|| panic!("run {k} failed: {}", rows[k]["error"]));
    assert!(peak(1) < peak(0), "checkpointing lowers the peak: {} vs {}", peak(1), peak(0));
    for (k, r) in rows.iter().enumerate() {
        let e = r["error_pct"].as_f64().unwrap();
        assert!(e.abs() < 10.0, "{}: measured {} predicted {} ({e:+.1} %)", names[k], peak(k), r["predicted_peak_bytes"]);
        assert!(
            dir.join("runs").join(r["trace"].as_str().unwrap()).exists() || std::path::Path::new(r["trace"].as_str().unwrap()).exists()
        );
    }
    assert!(dir.join("runs/verify.json").exists());
    // A program that does not take the flags: its runs fail and say so; the baseline stands.
    let out = collector(&dir)
        .args(["advise", "--verify", "--out-dir"])
        .arg(dir.join("bad"))
        .arg("--")
        .args(py("resnet18_train.py", &["--iters", "2"]))
        .output()
        .unwrap();
    let table = text(&out.stdout);
    assert!(out.status.success() && table.contains("| baseline |") && table.contains("failed"), "{table}\n{}", text(&out.stderr));
}

/// `--capture recorder` (PyTorch's recorder instead of the native capture) on a machine
/// without CUDA: the program runs as it would (its output and exit code pass through), and
/// the collector says, on stderr and in the trace's notes, that the recorder records CUDA
/// memory only and the process used none, so nothing was recorded.
#[test]
fn recorder_fallback_without_cuda_runs_the_program_and_says_nothing_was_recorded() {
    let (out, t, _) = trace("recorder_exit3", &["--capture", "recorder"], &py("exit3.py", &[]));
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(text(&out.stdout), "to stdout\n");
    let err = text(&out.stderr);
    assert!(err.contains("to stderr"), "{err}");
    let capture = "capture: PyTorch's recorder (fallback: forced by --capture recorder); it records CUDA memory only: no CPU memory, \
                   no operators, no live streaming (the trace arrives when the process ends)";
    let nothing = "the recorder fallback records CUDA memory only and this process used no CUDA, so nothing was recorded";
    assert!(err.contains(&format!("collector: {capture}")), "{err}");
    assert!(err.contains(&format!("(exit3.py): {nothing}")), "{err}");
    let t = t.expect("a trace that says why it is empty");
    assert_eq!(t.meta.warnings[..2], [capture.to_owned(), nothing.to_owned()], "{:?}", t.meta.warnings);
    // The recorder's frames are read whole by protocol::frames's types.
    assert!(!t.meta.warnings.iter().any(|w| w.starts_with(collector::pyrun::UNKNOWN_FIELDS)), "{:?}", t.meta.warnings);
    assert_eq!(t.meta.capture.as_deref(), capture.strip_prefix("capture: "));
    assert!(t.events.is_empty() && t.scopes.is_empty() && t.iterations.is_empty());
    assert_eq!(t.meta.source_format, shared::model::SourceFormat::PytorchSnapshot);
    assert_eq!(t.meta.model.as_deref(), Some("exit3.py"));

    // A training loop runs through every hook (modules, optimizer steps, backward) untouched.
    let (out, t, _) = trace("recorder_resnet", &["--capture", "recorder"], &py("resnet18_train.py", &["--iters", "2"]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("trained 2 iterations"));
    assert!(!text(&out.stderr).contains("memory-tracer:"), "the recorder stays quiet: {}", text(&out.stderr));
    assert!(t.expect("a trace").meta.warnings.iter().any(|w| w == nothing));
}

/// The recorder fallback's hooks, run as on a GPU (`recorder_hooks.py` gives the recorder a
/// fake CUDA memory API whose history keeps the recorder's own ranges and an allocation per
/// module output, gradient and optimizer state): every forward output lands under the module
/// that made it, with its phase, each gradient in the backward, each optimizer state in the
/// optimizer's step, one iteration per step, and each leaf module's peak is the allocated total
/// at its last allocation, as the native capture gives it. No CI test ran these hooks before,
/// and a missing attribute (`holders`) stopped every module scope on GPUs.
#[test]
fn recorder_fallback_hooks_attribute_modules_phases_and_iterations() {
    let (out, t, _) = trace("recorder_hooks", &["--capture", "recorder"], &py("recorder_hooks.py", &[]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let facts = json_line(&out, "FACTS ");
    assert!(!text(&out.stderr).contains("hooks failed"), "{}", text(&out.stderr));
    assert_eq!(facts["notes"], serde_json::json!([]), "the recorder noted a failure");
    let t = t.expect("a trace");
    assert!(!t.meta.warnings.iter().any(|w| w.contains("failed")), "{:?}", t.meta.warnings);
    assert_eq!(t.iterations.len(), 3, "one iteration per optimizer step");
    let allocs: Vec<usize> = (0..t.events.len()).filter(|&i| t.events.event_type(i) == shared::EventType::Alloc).collect();
    let want = facts["allocs"].as_array().unwrap();
    assert_eq!(allocs.len(), want.len());
    let mut total = 0u64;
    let mut leaf_peaks = std::collections::BTreeMap::<String, u64>::new();
    for (&i, w) in allocs.iter().zip(want) {
        let (who, phase) = (w["who"].as_str().unwrap(), w["phase"].as_str().unwrap());
        assert_eq!(t.events.size_bytes[i], w["size"].as_u64().unwrap());
        assert_eq!(t.events.phase(i).as_str(), phase, "{who}");
        total += t.events.size_bytes[i];
        if phase == "forward" {
            assert_eq!(t.str(t.events.layer[i]), who, "a forward output is its module's");
            leaf_peaks.insert(who.to_owned(), total);
        } else if phase == "optimizer" {
            assert!(t.str(t.events.layer[i]).ends_with(".step"), "{}", t.str(t.events.layer[i]));
        }
    }
    assert_eq!(leaf_peaks.len(), 7, "{leaf_peaks:?}");
    let stats = layer_stats(&t);
    for (leaf, peak) in &leaf_peaks {
        assert_eq!(stats.get(leaf).map(|s| s.peak_allocated), Some(*peak), "{leaf}'s peak");
    }
    let scopes: std::collections::BTreeSet<(String, u16)> = t.scopes.iter().map(|s| (t.str(s.name).to_owned(), s.depth)).collect();
    for want in [("Net", 0), ("blocks.0", 1), ("blocks.2.down", 2), ("head", 1)] {
        assert!(scopes.contains(&(want.0.to_owned(), want.1)), "{want:?} missing from {scopes:?}");
    }
}

/// The recorder's side in the collector, on real snapshots (an H100's, `tests/data`) with the
/// annotations `_history.py` makes added, written as it writes them (`annotate_snapshot.py`):
/// two snapshots of one process, one after the other, become one trace whose iterations, layer
/// scopes (depth, phase), every allocation's layer and phase are what the annotations say, whose
/// events and peak are the two snapshots' own (the peak PyTorch counted), and whose notes say
/// which capture ran. A snapshot file cut short is left out and named.
#[test]
fn recorder_snapshots_become_layer_scopes_phases_and_iterations() {
    use collector::pyrun::wire::ProcessStream;
    use serde_json::{json, Value};
    let dir = workdir("recorder_snapshots");
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data");
    let inputs = [data.join("mlp_adam_3steps.pickle"), data.join("resnet18_sgd_2steps.pickle")];
    let out = Command::new(python()).arg(program("annotate_snapshot.py")).arg(&*dir).args(&inputs).output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let facts: Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut notes: Vec<Value> = facts["files"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(k, f)| json!({"kind": "recorder_snapshot", "pid": 4242, "file": f["name"], "bytes": f["bytes"], "index": k, "pieces": f["pieces"]}))
        .collect();
    // A third snapshot cut short (the process killed while writing) is left out.
    std::fs::write(dir.join("recorder-1-2.pickles"), b"\x80\x02]cut").unwrap();
    let pieces = json!([{"what": "entries", "device": 0, "offset": 0, "bytes": 99}]);
    notes
        .push(json!({"kind": "recorder_snapshot", "pid": 4242, "file": "recorder-1-2.pickles", "bytes": 99, "index": 2, "pieces": pieces}));
    let p = ProcessStream {
        hello: serde_json::from_value(json!({"capture": "recorder", "reason": "no capture library for torch 2.16.0", "pid": 4242,
            "argv": ["python", "train.py"], "torch_version": "2.16.0", "start_unix_ns": 1_795_290_733_000_000_000u64,
            "env": {"RANK": "1", "WORLD_SIZE": "2"}}))
        .unwrap(),
        end: serde_json::from_value(json!({"reason": "exit", "cuda_used": true, "notes": ["a note of the process"],
            "cuda": [{"device": 0, "name": "NVIDIA H100 80GB HBM3", "allocated_peak": 238_078_976u64, "reserved_peak": 260_046_848u64}]}))
        .unwrap(),
        notes: serde_json::from_value(Value::Array(notes)).unwrap(),
        snapshot_dir: Some(dir.to_path_buf()),
        ..ProcessStream::default()
    };
    let t = collector::pyrun::build_trace(p, &collector::pyrun::PyOptions::default()).unwrap();

    let iterations: Vec<[u64; 3]> = t.iterations.iter().map(|i| [u64::from(i.index), i.start_ns, i.end_ns]).collect();
    let want: Vec<[u64; 3]> = serde_json::from_value(facts["iterations"].clone()).unwrap();
    assert_eq!(iterations, want);
    let mut by_layer = std::collections::BTreeMap::<String, u64>::new();
    let mut by_phase = std::collections::BTreeMap::<String, u64>::new();
    for i in (0..t.events.len()).filter(|&i| t.events.event_type(i) == shared::EventType::Alloc) {
        *by_layer.entry(t.str(t.events.layer[i]).to_owned()).or_default() += 1;
        *by_phase.entry(t.events.phase(i).as_str().to_owned()).or_default() += 1;
    }
    assert_eq!(by_layer, serde_json::from_value(facts["allocs_by_layer"].clone()).unwrap());
    assert_eq!(by_phase, serde_json::from_value(facts["allocs_by_phase"].clone()).unwrap());
    let scopes: std::collections::BTreeSet<(String, u16, Phase)> =
        t.scopes.iter().map(|s| (t.str(s.name).to_owned(), s.depth, s.phase)).collect();
    let want_scopes = [
        ("Model", 0, Phase::Forward),
        ("block", 1, Phase::Forward),
        ("block.conv", 2, Phase::Forward),
        ("head", 1, Phase::Forward),
        ("optimizer.step", 0, Phase::Optimizer),
    ];
    assert_eq!(scopes, want_scopes.iter().map(|(n, d, p)| (n.to_string(), *d, *p)).collect(), "only our annotations become scopes");
    assert_eq!(t.scopes.len(), 5 * 5);

    // The events, totals and peak are the snapshots' own, replayed end to end on one device
    // from the first snapshot's first entry (the later one alone starts from memory it can
    // only recover from its segments).
    let parts: Vec<Trace> = inputs.iter().map(|f| shared::import::snapshot::import(&std::fs::read(f).unwrap()).unwrap()).collect();
    assert_eq!(t.events.len(), parts.iter().map(|p| p.events.len()).sum::<usize>());
    let peak = |t: &Trace| shared::analysis::summary(t).peak_allocated_bytes;
    assert_eq!(peak(&t), 238_078_976, "PyTorch's max_memory_allocated() of the later snapshot (tests/data/facts.json)");
    // (Allocated only: between these two recordings the allocator gave back segments, which no
    // entry records, so the replay ends with more reserved than the later recording's state.)
    assert_eq!(t.events.final_totals()[0].allocated_bytes, parts[1].events.final_totals()[0].allocated_bytes);
    assert_eq!(t.events.base_totals, parts[0].events.base_totals, "nothing was allocated before the first snapshot's first entry");
    assert!(t.events.ts_ns.windows(2).all(|w| w[0] <= w[1]));
    assert_eq!(t.stacks.event_stacks.len(), parts.iter().map(|p| p.stacks.event_stacks.len()).sum::<usize>());
    let e = t.events.len() - 1;
    let (mine, theirs) = (t.stacks.stack_of_event(e).unwrap(), parts[1].stacks.stack_of_event(parts[1].events.len() - 1).unwrap());
    let names = |t: &Trace, s: u32| t.stacks.stack(s).map(|f| t.str(f.name).to_owned()).collect::<Vec<_>>();
    assert_eq!(names(&t, mine), names(&parts[1], theirs), "stacks are carried over");
    assert_eq!(t.devices.len(), 1);

    let w = &t.meta.warnings;
    assert!(
        w[0].starts_with("capture: PyTorch's recorder (fallback: no capture library for torch 2.16.0); it records CUDA memory only"),
        "{w:?}"
    );
    assert!(
        w.iter().any(|n| n.starts_with("snapshot 2 (recorder-1-2.pickles) and the later ones were left out")
            && n.contains("holds 6 bytes where the process wrote 99")),
        "{w:?}"
    );
    assert!(w.iter().any(|n| n == "a note of the process"), "{w:?}");
    assert!(!w.iter().any(|n| n.contains("annotated spans outside")), "{w:?}");
    assert_eq!(t.meta.reported.get("cuda.max_memory_allocated"), Some(&238_078_976));
    assert_eq!(t.meta.rank_var(shared::model::RankVar::Rank), Some(1));
    assert_eq!((t.meta.model.as_deref(), t.meta.device_name.as_deref()), (Some("train.py"), Some("NVIDIA H100 80GB HBM3")));
    assert_eq!(t.meta.start_unix_ns, t.events.ts_ns.first().copied());

    // Written and read back as any trace.
    let file = dir.join("stitched.mtrace.json");
    traceio::files::write_export(&t, shared::export::ExportFormat::Native, &file).unwrap();
    let back = load_trace(&file, &ImportOptions::default()).unwrap();
    assert_eq!((back.events.len(), back.iterations.len(), peak(&back)), (t.events.len(), 5, 238_078_976));
}

/// Whether this torch's saved variables show what they keep without unpacking (`data`).
fn saved_data_readable() -> bool {
    let probe = "import torch; print(hasattr(getattr(torch._C._autograd, 'SavedTensor', None), 'data'))";
    let out = Command::new(python()).args(["-c", probe]).output().unwrap();
    text(&out.stdout).trim() == "True"
}

/// `collector trace --holders`: at a mark after the forward pass, the parameter, buffer and
/// optimizer-state bytes `collector why` names are what `named_parameters()`,
/// `named_buffers()` and `optimizer.state` hold, the saved-for-backward bytes of each module
/// are the storages its nodes' `_saved_*` reach (each once, parameters excluded), and after
/// backward the gradients are the parameters' `.grad`; on a torchvision ResNet, a transformers
/// causal LM with AdamW and bf16 autocast, a mixture of experts, with activation checkpointing,
/// torch.compile and the program's own saved-tensor hooks, whose results and hook calls are
/// the same untraced.
#[test]
fn holders_are_what_pytorchs_own_objects_hold() {
    use shared::analysis::holders::{why_with, Moment};
    use shared::model::HolderKind;
    let cases: [(&str, &[&str]); 7] = [
        ("resnet", &["resnet"]),
        ("lm", &["lm"]),
        ("moe", &["moe"]),
        ("lm_checkpoint", &["lm", "--checkpoint"]),
        ("moe_checkpoint", &["moe", "--checkpoint"]),
        ("resnet_compile", &["resnet", "--compile"]),
        ("moe_user_hooks", &["moe", "--user-hooks"]),
    ];
    // `cargo xtask test` runs some of them on the other torches (xtask's OTHER_TORCH_HOLDER_CASES).
    let only = std::env::var("MEMORY_TRACER_HOLDER_CASES").ok();
    let only: Option<Vec<&str>> = only.as_deref().map(|s| s.split(',').collect());
    if let Some(only) = &only {
        for o in only {
            assert!(cases.iter().any(|(n, _)| n == o), "MEMORY_TRACER_HOLDER_CASES names {o:?}, not a case");
        }
    }
    for (name, args) in cases.into_iter().filter(|(n, _)| only.as_ref().is_none_or(|o| o.contains(n))) {
        let plain = Command::new(python()).arg(program("holders_check.py")).args(args).env_remove("PYTHONPATH").output().unwrap();
        assert!(plain.status.success(), "{name} untraced: {}", text(&plain.stderr));
        let (out, t, dir) = trace(&format!("holders_{name}"), &["--holders"], &py("holders_check.py", args));
        assert!(out.status.success(), "{name}: {}", text(&out.stderr));
        let (plain, facts) = (json_line(&plain, "FACTS "), json_line(&out, "FACTS "));
        assert_eq!(
            (&plain["loss"], &plain["hooks"]),
            (&facts["loss"], &facts["hooks"]),
            "{name}: untraced (left) and traced (right) differ"
        );
        let t = t.expect("a trace");
        assert!(!t.event_holders.is_empty(), "{name}: no holders recorded");
        let fwd = why_with(&t, &Moment::parse("after_forward").unwrap(), None, false).unwrap();
        let bytes = |w: &shared::analysis::holders::Why, kind: HolderKind| -> u64 {
            w.holders.iter().filter(|g| g.kind == kind && !g.inferred).map(|g| g.bytes).sum()
        };
        // The capture read every parameter and buffer: a block it never saw held (the batch the
        // program keeps) is not taken for one by its lifetime.
        let guessed: Vec<_> =
            fwd.holders.iter().filter(|g| g.inferred && matches!(g.kind, HolderKind::Parameter | HolderKind::Buffer)).collect();
        assert!(guessed.is_empty(), "{name}: {guessed:?}");
        let f = &facts["after_forward"];
        for (kind, key) in
            [(HolderKind::Parameter, "parameter"), (HolderKind::Buffer, "buffer"), (HolderKind::OptimizerState, "optimizer_state")]
        {
            assert_eq!(bytes(&fwd, kind), f[key].as_u64().unwrap(), "{name}: {key} bytes at after_forward");
        }
        let expected: std::collections::BTreeMap<String, u64> =
            f["saved_for_backward"].as_object().unwrap().iter().map(|(m, b)| (m.clone(), b.as_u64().unwrap())).collect();
        let mut got: std::collections::BTreeMap<String, u64> = Default::default();
        for g in fwd.holders.iter().filter(|g| g.kind == HolderKind::SavedForBackward && !g.inferred) {
            // Saved outside every module: PyTorch's objects have no module, the trace names the
            // line of the program's own code (Python 3.12+).
            let module = if shared::model::is_source_layer(&g.module) { String::new() } else { g.module.clone() };
            *got.entry(module).or_default() += g.bytes;
        }
        // A torch whose saved variables do not show what they keep (2.6 does not) reads them by
        // unpacking, so not once the program entered a saved-tensor hook; the trace says so.
        let unread = t.meta.warnings.iter().any(|w| w.contains("cannot show a saved tensor without unpacking"));
        assert_eq!(
            unread,
            !saved_data_readable() && (args.contains(&"--checkpoint") || args.contains(&"--user-hooks")),
            "{name}: {:?}",
            t.meta.warnings
        );
        if !unread {
            if args.contains(&"--compile") || args.contains(&"--checkpoint") {
                // Compiled graphs have no module hooks to read; a checkpoint's kept inputs are
                // counted on their own by the program.
                assert_eq!(
                    got.values().sum::<u64>(),
                    expected.values().sum::<u64>(),
                    "{name}: saved bytes at after_forward: {got:?} {expected:?}"
                );
            } else {
                assert_eq!(got, expected, "{name}: saved bytes per module at after_forward (the trace's left)");
            }
            assert!(fwd.coverage() >= 0.99, "{name}: {:.4} of the live bytes have a holder: {:#?}", fwd.coverage(), fwd.holders);
        }
        // At the allocated peak (inside a forward, a backward or the first optimizer step),
        // recorded holders name what lives: gradients and optimizer state from their
        // allocation, what the step under way made as its temporaries.
        let peak = why_with(&t, &Moment::Peak, None, false).unwrap();
        let recorded = peak.recorded_bytes as f64 / peak.live_bytes.max(1) as f64;
        assert!(recorded >= 0.99, "{name}: {recorded:.4} of the live bytes at the peak by recorded holders: {:#?}", peak.holders);
        let bwd = why_with(&t, &Moment::parse("after_backward").unwrap(), None, false).unwrap();
        assert_eq!(bytes(&bwd, HolderKind::Gradient), facts["after_backward"]["gradient"].as_u64().unwrap(), "{name}: gradient bytes");
        if name == "lm" {
            // The command's JSON, and a moment that does not exist.
            let file = dir.join("out.mtrace.json");
            let j = collector(&dir).args(["why", "--json", "--at", "after_forward"]).arg(&file).output().unwrap();
            assert!(j.status.success(), "{}", text(&j.stderr));
            let j: serde_json::Value = serde_json::from_slice(&j.stdout).unwrap();
            assert_eq!(j["at"]["kind"], "mark");
            assert_eq!(j["live_bytes"], fwd.live_bytes);
            let first = &j["holders"][0];
            for key in ["kind", "name", "module", "bytes", "blocks", "released_at_s"] {
                assert!(first.get(key).is_some(), "no {key} in {first}");
            }
            let bad = collector(&dir).args(["why", "--at", "after_lunch"]).arg(&file).output().unwrap();
            assert!(!bad.status.success());
            assert!(text(&bad.stderr).contains("after_forward, after_backward"), "{}", text(&bad.stderr));
            let s = collector(&dir).args(["summary"]).arg(&file).output().unwrap();
            assert!(text(&s.stdout).contains("held at the peak"), "{}", text(&s.stdout));
        }
    }
}

/// `--holders=python`: at a mark, the Python variables and attributes holding tensors are
/// named (`main:trainer.last_batch`, a list's items folded as `main:history[{0..7}]`), and
/// `leaks` names what holds the tensors each iteration leaves behind.
/// `--holders=python` names the Python variables holding tensors when an out-of-memory error
/// is made, with no mark: the list a loop keeps its batches in (the program raises the error
/// itself on the CPU, as torch does from C++), and the program goes on as untraced.
#[test]
fn python_variables_are_named_at_an_out_of_memory_error() {
    use shared::model::HolderKind;
    let (out, t, _dir) = trace("holders_oom", &["--holders=python"], &py("holders_oom.py", &[]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("OOM after 4 batches"), "{}", text(&out.stdout));
    let t = t.expect("a trace");
    assert!(t.marks.is_empty());
    let mut names: Vec<(String, u64)> = t
        .event_holders
        .iter()
        .filter(|h| h.kind == HolderKind::Python)
        .map(|h| (t.str(h.name).to_owned(), t.events.size_bytes[h.event as usize]))
        .collect();
    names.sort();
    let expected: Vec<(String, u64)> = (0..4).map(|k| (format!("main:keep[{k}]"), 256 << 10)).collect();
    assert_eq!(names, expected);
}

#[test]
fn python_variables_holding_tensors_are_named() {
    use shared::analysis::holders::{why, Moment};
    use shared::model::HolderKind;
    let (out, t, dir) = trace("holders_python", &["--holders=python"], &py("holders_python.py", &[]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let t = t.expect("a trace");
    let w = why(&t, &Moment::parse("end").unwrap(), None).unwrap();
    let python: Vec<(&str, u64, u64)> =
        w.holders.iter().filter(|g| g.kind == HolderKind::Python).map(|g| (g.name.as_str(), g.bytes, g.blocks)).collect();
    assert_eq!(
        python,
        [("main:trainer.last_batch", 512 << 10, 1), ("main:history[{0..7}]", 8 * (16 << 10), 8), ("main:evaluate:probe", 64 << 10, 1)],
        "{:#?}",
        w.holders
    );
    assert_eq!(w.coverage(), 1.0, "{:#?}", w.holders);
    let leaks = collector(&dir).args(["leaks"]).arg(dir.join("out.mtrace.json")).output().unwrap();
    assert!(text(&leaks.stdout).contains("held by python main:history["), "{}", text(&leaks.stdout));
}
