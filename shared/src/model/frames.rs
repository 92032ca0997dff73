//! Which frames of a stack are the program's and which are the runtime's: CPython's
//! interpreter, PyTorch's dispatcher, caching allocator and unwinder, `nn.Module`'s call
//! plumbing, the C library, frames with no name (`??`). Stack summaries, pinned stacks and the
//! flame graph fold the runtime's frames by default (a switch shows them), so what a user
//! reads first is their own code; a stack with no Python frame keeps its C++ frames outside
//! PyTorch (a custom extension, NCCL, cuBLAS).

/// Names of the runtime's frames that say nothing of what made the memory, by prefix: the
/// unwinder, the caching allocator, c10, CPython's API and loop, the C library's start-up and
/// threads, unnamed ones.
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
    "call_function",
    "_call_function",
    "function_code_fastcall",
];

/// Names of PyTorch's own C++ frames, by prefix: its dispatcher, operators and autograd nodes
/// (the runtime's, but they say which operator or node made the memory).
const PYTORCH_NAME_PREFIXES: &[&str] = &["torch::", "at::", "caffe2::", "THP"];

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

/// What a frame is to a reader of its stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameRole {
    /// The program's own code, a library model's, an extension's: shown.
    Program,
    /// PyTorch's C++ (its dispatcher, operators, autograd nodes): folded, but shown where a
    /// stack has nothing of the program's.
    PyTorch,
    /// Everything else of the runtime (see the module's doc): always folded.
    Noise,
}

/// What the frame `name` in `file` is (see [`FrameRole`]).
pub fn frame_role(name: &str, file: &str) -> FrameRole {
    if is_python_frame(file) {
        return if RUNTIME_PYTHON_FILES.iter().any(|p| file.contains(p)) { FrameRole::Noise } else { FrameRole::Program };
    }
    let name = name.trim_start();
    if name.is_empty() || NOISE_NAME_PREFIXES.iter().any(|p| name.starts_with(p)) {
        return FrameRole::Noise;
    }
    // After a return type too: `void torch::autograd::validate_outputs_impl<...>(...)`.
    let head = name.split('(').next().unwrap_or(name);
    let pytorch = PYTORCH_NAME_PREFIXES.iter().any(|p| name.starts_with(p))
        || [" torch::", " c10::", " at::"].iter().any(|ns| head.contains(ns))
        || RUNTIME_FILE_PARTS.iter().any(|p| file.contains(p));
    if pytorch {
        FrameRole::PyTorch
    } else {
        FrameRole::Program
    }
}

/// Whether the frame `name` in `file` is the runtime's, not the program's (see the module's
/// doc): folded by default wherever a stack is shown.
pub fn is_runtime_frame(name: &str, file: &str) -> bool {
    frame_role(name, file) != FrameRole::Program
}

/// The positions of a stack's frames shown by default, from their roles (innermost first):
/// every frame of the program's; where there is none (an allocation made in the autograd
/// engine's thread, whose stack is all PyTorch's C++), PyTorch's frames that say which
/// operator or autograd node made it, without the noise.
pub fn shown_of_roles(roles: &[FrameRole]) -> Vec<u32> {
    let of = |want: FrameRole| (0..roles.len()).filter(|&i| roles[i] == want).map(|i| i as u32).collect::<Vec<u32>>();
    let mine = of(FrameRole::Program);
    if mine.is_empty() {
        of(FrameRole::PyTorch)
    } else {
        mine
    }
}

/// [`shown_of_roles`] of a stack's frames (`(name, file)`, innermost first).
pub fn shown_frames<'a>(frames: impl IntoIterator<Item = (&'a str, &'a str)>) -> Vec<u32> {
    let roles: Vec<FrameRole> = frames.into_iter().map(|(name, file)| frame_role(name, file)).collect();
    shown_of_roles(&roles)
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
