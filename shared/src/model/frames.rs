//! Which frames of a stack are the program's and which are the runtime's: CPython's
//! interpreter, PyTorch's dispatcher, caching allocator and unwinder, `nn.Module`'s call
//! plumbing, the C library, frames with no name (`??`). Stack summaries, pinned stacks and the
//! flame graph fold the runtime's frames by default (a switch shows them), so what a user
//! reads first is their own code; a stack with no Python frame keeps its C++ frames outside
//! PyTorch (a custom extension, NCCL, cuBLAS).

/// C++ and C names of the runtime, by prefix: PyTorch's namespaces and Python bindings,
/// CPython's API and interpreter loop, the C library's start-up and threads.
const RUNTIME_NAME_PREFIXES: &[&str] = &[
    "??",
    "torch::",
    "c10::",
    "at::",
    "caffe2::",
    "pybind11::",
    "THP",
    "std::",
    "_Py",
    "Py",
    "__libc",
    "_start",
    "start_thread",
    "clone",
    "cfunction_",
    "method_vectorcall",
    "slot_tp_",
    "vectorcall_",
    "call_function",
    "_call_function",
    "pymain_",
    "_PyEval",
    "function_code_fastcall",
];

/// Source files of the runtime's C++ and C frames, by part of their path.
const RUNTIME_FILE_PARTS: &[&str] =
    &["/torch/csrc/", "/c10/", "/aten/", "/Python/", "/Objects/", "/Modules/", "/Include/", "/csu/", "/nptl/", "/sysdeps/", "??"];

/// Python files whose frames are plumbing between the program's code and the operator:
/// `nn.Module.__call__`, decorators' wrappers, torch.compile's frame evaluation, module hooks,
/// this tool's own package.
const RUNTIME_PYTHON_FILES: &[&str] = &[
    "/torch/nn/modules/module.py",
    "/torch/utils/_contextlib.py",
    "/torch/_dynamo/eval_frame.py",
    "/torch/_compile.py",
    "/torch/utils/hooks.py",
    "/torch/_ops.py",
    "/torch/overrides.py",
    "/memory_tracer/",
    "<frozen runpy>",
    "/runpy.py",
];

/// Whether `file` is Python source (or Python's stand-in for it: `<string>`, a generated
/// `<eval_with_key>.3`).
pub fn is_python_frame(file: &str) -> bool {
    file.ends_with(".py") || (file.starts_with('<') && !file.starts_with("<unknown"))
}

/// Whether the frame `name` in `file` is the runtime's, not the program's (see the module's
/// doc): folded by default wherever a stack is shown.
pub fn is_runtime_frame(name: &str, file: &str) -> bool {
    if is_python_frame(file) {
        return RUNTIME_PYTHON_FILES.iter().any(|p| file.contains(p));
    }
    let name = name.trim_start();
    name.is_empty()
        || RUNTIME_NAME_PREFIXES.iter().any(|p| name.starts_with(p))
        // after a return type: `void torch::autograd::validate_outputs_impl<...>(...)`
        || [" torch::", " c10::", " at::"].iter().any(|ns| name.split('(').next().is_some_and(|head| head.contains(ns)))
        || RUNTIME_FILE_PARTS.iter().any(|p| file.contains(p))
        || (file.is_empty() && name.contains("::") && name.split("::").next().is_some_and(|ns| ["torch", "c10", "at"].contains(&ns)))
}

/// Names of frames that say nothing of what made the memory even where nothing else is left:
/// the unwinder, the caching allocator, CPython, the C library, unnamed ones.
const NOISE_NAME_PREFIXES: &[&str] = &[
    "??",
    "torch::unwind",
    "torch::CapturedTraceback",
    "torch::cuda::(anonymous namespace)::gather",
    "c10::",
    "std::",
    "pybind11::",
    "_Py",
    "Py",
    "__libc",
    "__clone",
    "pthread_",
    "_start",
    "start_thread",
    "clone",
    "cfunction_",
    "method_vectorcall",
    "slot_tp_",
    "vectorcall_",
    "pymain_",
];

/// The positions of a stack's frames (`(name, file)`, innermost first) shown by default: every
/// frame that is not the runtime's; where that leaves none (an allocation made in the autograd
/// engine's thread, whose stack is all PyTorch's C++), PyTorch's frames that say which
/// operator or autograd node made it, without the unwinder, the allocator and CPython.
pub fn shown_frames<'a>(frames: impl IntoIterator<Item = (&'a str, &'a str)>) -> Vec<u32> {
    let frames: Vec<(&str, &str)> = frames.into_iter().collect();
    let mine: Vec<u32> = (0..frames.len()).filter(|&i| !is_runtime_frame(frames[i].0, frames[i].1)).map(|i| i as u32).collect();
    if !mine.is_empty() {
        return mine;
    }
    (0..frames.len())
        .filter(|&i| {
            let name = frames[i].0.trim_start();
            !name.is_empty() && !NOISE_NAME_PREFIXES.iter().any(|p| name.starts_with(p))
        })
        .map(|i| i as u32)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runtime_is_folded_and_the_program_kept() {
        for (name, file) in [
            ("torch::unwind::unwind()", "??"),
            ("c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed char, unsigned long, CUstream_st*)", "??"),
            ("_PyEval_EvalFrameDefault", "??"),
            ("at::native::empty_cuda(...)", "/pytorch/aten/src/ATen/native/cuda/EmptyTensor.cpp"),
            ("PyObject_Call", ""),
            ("__libc_start_main", "??"),
            ("_call_impl", "/venv/lib/python3.12/site-packages/torch/nn/modules/module.py"),
            ("", "??"),
            ("void torch::autograd::validate_outputs_impl<torch::autograd::Edge>(std::vector<at::Tensor>&)", "engine.cpp"),
        ] {
            assert!(is_runtime_frame(name, file), "{name} {file} should be folded");
        }
        for (name, file) in [
            ("forward", "/venv/lib/python3.12/site-packages/torchvision/models/resnet.py"),
            ("_conv_forward", "/venv/lib/python3.12/site-packages/torch/nn/modules/conv.py"),
            ("<module>", "train.py"),
            ("my_ext::fused_op(at::Tensor const&)", "/src/my_ext/fused.cu"),
            ("ncclGroupEnd", "/nccl/src/group.cc"),
            ("forward", "<eval_with_key>.3"),
        ] {
            assert!(!is_runtime_frame(name, file), "{name} {file} should be shown");
        }
        assert_eq!(
            shown_frames([("torch::unwind::unwind()", "??"), ("forward", "model.py"), ("_call_impl", "/x/torch/nn/modules/module.py")]),
            [1]
        );
        assert!(shown_frames([("??", "??")]).is_empty());
        // All PyTorch's C++ (the autograd engine's thread): its operator frames, not the noise.
        assert_eq!(
            shown_frames([
                ("torch::unwind::unwind()", "??"),
                ("c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(...)", "CUDACachingAllocator.cpp"),
                ("at::native::cudnn_convolution_backward(...)", "ConvShared.cpp"),
                ("torch::autograd::generated::ConvolutionBackward0::apply(...)", "Functions.cpp"),
                ("start_thread", "??"),
            ]),
            [2, 3]
        );
    }
}
