//! The capture's contract has three views: the C header (`shim/mt_shim.h`, what the shim is
//! compiled from), the Rust one (`record::layout`, `record::sys`) and the Python package's
//! ctypes (`memory_tracer/_shim.py`). These tests compile the header, load the Python module
//! and compare every struct field's offset and size and every function's signature, so a
//! change to one view that the others do not follow fails here.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

fn header() -> String {
    std::fs::read_to_string(root().join("shim/mt_shim.h")).unwrap()
}

/// `(struct, field) -> (offset, size)`.
type Layout = BTreeMap<(String, String), (usize, usize)>;

/// The fields of each `typedef struct Name { ... } Name;` in the header, in order.
fn header_structs(h: &str) -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    let mut rest = h;
    while let Some(i) = rest.find("typedef struct ") {
        let after = &rest[i + "typedef struct ".len()..];
        let name: String = after.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        let body = &after[after.find('{').unwrap() + 1..after.find('}').unwrap()];
        let mut fields = Vec::new();
        for line in body.lines() {
            let code = line.split("//").next().unwrap().trim();
            let Some(decl) = code.strip_suffix(';') else { continue };
            // `uint64_t a, b, c;` declares several.
            let mut words = decl.splitn(2, ' ');
            let _ty = words.next();
            for f in words.next().unwrap_or("").split(',') {
                fields.push(f.trim().to_owned());
            }
        }
        out.insert(name, fields);
        rest = &after[after.find('}').unwrap()..];
    }
    out
}

/// Offsets and sizes as the C++ compiler lays the header's structs out.
fn c_layout(structs: &BTreeMap<String, Vec<String>>) -> Layout {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("layout");
    std::fs::create_dir_all(&dir).unwrap();
    let mut src = String::from("#include <cstdio>\n#include <cstddef>\n#include \"mt_shim.h\"\nint main() {\n");
    for (name, fields) in structs {
        for f in fields {
            src.push_str(&format!("  std::printf(\"{name} {f} %zu %zu\\n\", offsetof({name}, {f}), sizeof((({name}*)0)->{f}));\n"));
        }
        src.push_str(&format!("  std::printf(\"{name} <size> 0 %zu\\n\", sizeof({name}));\n"));
    }
    src.push_str("}\n");
    std::fs::write(dir.join("layout.cpp"), src).unwrap();
    let exe = dir.join("layout");
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let out = Command::new(&cxx)
        .arg("-I")
        .arg(root().join("shim"))
        .arg(dir.join("layout.cpp"))
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cxx}: {e}"));
    assert!(out.status.success(), "compiling the header failed: {}", String::from_utf8_lossy(&out.stderr));
    let out = Command::new(&exe).output().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    parse_layout(&String::from_utf8_lossy(&out.stdout))
}

fn parse_layout(text: &str) -> Layout {
    text.lines()
        .map(|l| {
            let p: Vec<&str> = l.split_whitespace().collect();
            ((p[0].to_owned(), p[1].to_owned()), (p[2].parse().unwrap(), p[3].parse().unwrap()))
        })
        .collect()
}

macro_rules! rust_layout {
    ($out:ident, $ty:ident: $($field:ident),* $(,)?) => {{
        let probe = record::$ty::default();
        $(
            $out.insert(
                (stringify!($ty).to_owned(), stringify!($field).to_owned()),
                (std::mem::offset_of!(record::$ty, $field), std::mem::size_of_val(&probe.$field)),
            );
        )*
        $out.insert((stringify!($ty).to_owned(), "<size>".to_owned()), (0, std::mem::size_of::<record::$ty>()));
    }};
}

fn rust() -> Layout {
    let mut out = Layout::new();
    rust_layout!(out, MtRecord: ts_ns, id, value, a, b, op, name, thread, kind, device_type, device_index, phase, c);
    rust_layout!(out, MtCounters: mem_kept, mem_dropped, op_kept, op_dropped, peak_allocated, peak_reserved, buffer_dropped);
    rust_layout!(out, MtDeviceStats: allocated_current, allocated_peak, reserved_current, reserved_peak, num_alloc_retries, num_ooms);
    rust_layout!(out, MtHolder: ts_ns, ptr, bytes, seq, name, module, kind, take, device_type, device_index, unused);
    out
}

fn python() -> String {
    std::env::var("MEMORY_TRACER_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// What `_shim.py` declares: its structs' layouts and its functions' signatures, each type as
/// a canonical name (`u64`, `i32`, `ptr`, `void`). The module is loaded alone (it imports no
/// torch at load time).
fn python_view() -> serde_json::Value {
    let shim = root().join("../collector/python/memory_tracer/_shim.py");
    let script = r#"
import ctypes, importlib.util, json, sys
spec = importlib.util.spec_from_file_location("_shim", sys.argv[1])
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
def canon(t):
    if t is None:
        return "void"
    if t is ctypes.c_char_p or t is ctypes.c_void_p or getattr(t, "_type_", None) and isinstance(t._type_, type):
        return "ptr"
    signed = t(-1).value == -1
    return ("i" if signed else "u") + str(8 * ctypes.sizeof(t))
structs = {"MtCounters": m.Counters, "MtHolder": m.Holder}
layout = [[name, f, getattr(cls, f).offset, getattr(cls, f).size] for name, cls in structs.items() for f, _ in cls._fields_]
layout += [[name, "<size>", 0, ctypes.sizeof(cls)] for name, cls in structs.items()]
sigs = {n: [[canon(a) for a in args], canon(res)] for n, (args, res) in m.SIGNATURES.items()}
frames = {n: getattr(m, n) for n in dir(m) if n.startswith("FRAME_")}
holders = {n: getattr(m, n) for n in dir(m) if n.startswith("HOLDER_") and isinstance(getattr(m, n), int)}
import struct
packed = struct.calcsize(m.HOLDER_FORMAT)
print(json.dumps({"layout": layout, "signatures": sigs, "frames": frames, "holders": holders, "holder_format_bytes": packed}))
"#;
    let out = Command::new(python()).arg("-c").arg(script).arg(&shim).output().unwrap();
    assert!(out.status.success(), "loading {}: {}", shim.display(), String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn c_rust_and_python_lay_every_struct_out_alike() {
    let h = header();
    let structs = header_structs(&h);
    assert_eq!(structs.keys().collect::<Vec<_>>(), ["MtCounters", "MtDeviceStats", "MtHolder", "MtRecord"]);
    let c = c_layout(&structs);
    let r = rust();
    assert_eq!(c, r, "the header (left) and record::layout (right) differ");
    let py = python_view();
    let mut checked = 0;
    for row in py["layout"].as_array().unwrap() {
        let key = (row[0].as_str().unwrap().to_owned(), row[1].as_str().unwrap().to_owned());
        let got = (row[2].as_u64().unwrap() as usize, row[3].as_u64().unwrap() as usize);
        assert_eq!(c.get(&key), Some(&got), "_shim.py's {key:?} is {got:?}; the header says {:?}", c.get(&key));
        checked += 1;
    }
    let in_header = structs["MtCounters"].len() + 1 + structs["MtHolder"].len() + 1;
    assert_eq!(checked, in_header, "_shim.py's Counters and Holder must declare every field of MtCounters and MtHolder");
    // The package packs holders with `struct` (HOLDER_FORMAT), not ctypes: the same bytes.
    assert_eq!(py["holder_format_bytes"].as_u64(), Some(std::mem::size_of::<record::MtHolder>() as u64));
}

/// Canonical type names of a C declaration's type.
fn c_type(t: &str) -> String {
    let t = t.trim();
    if t.contains('*') {
        return "ptr".into();
    }
    match t.trim_start_matches("const ").trim() {
        "void" => "void",
        "uint64_t" | "size_t" => "u64",
        "int64_t" => "i64",
        "uint32_t" => "u32",
        "int32_t" | "int" => "i32",
        "uint8_t" => "u8",
        "int8_t" => "i8",
        other => panic!("the header uses a type this test does not know: {other}"),
    }
    .into()
}

fn rust_type(t: &str) -> String {
    let t = t.trim();
    if t.starts_with('*') {
        return "ptr".into();
    }
    match t {
        "" => "void",
        "u64" | "usize" => "u64",
        "i64" => "i64",
        "u32" => "u32",
        "c_int" | "i32" => "i32",
        "u8" => "u8",
        "i8" => "i8",
        other => panic!("record::sys uses a type this test does not know: {other}"),
    }
    .into()
}

type Signatures = BTreeMap<String, (Vec<String>, String)>;

/// `name -> (argument types, result type)` of every `mt_*` function the header declares.
fn header_functions(h: &str) -> Signatures {
    let code: String = h.lines().map(|l| l.split("//").next().unwrap()).collect::<Vec<_>>().join(" ");
    let mut out = Signatures::new();
    for decl in code.split(';') {
        let Some(open) = decl.find("mt_").filter(|_| decl.contains('(')) else { continue };
        let paren = decl.find('(').unwrap();
        if paren < open {
            continue;
        }
        let name = decl[open..paren].trim().to_owned();
        let ret = c_type(decl[..open].trim().rsplit(['{', '}']).next().unwrap());
        let args = &decl[paren + 1..decl.rfind(')').unwrap()];
        let args: Vec<String> = if args.trim() == "void" {
            vec![]
        } else {
            args.split(',')
                .map(|a| {
                    let a = a.trim();
                    // Drop the parameter's name: the last word, and any `*` stays with the type.
                    let ty = &a[..a.rfind(|c: char| !(c.is_alphanumeric() || c == '_')).map_or(0, |i| i + 1)];
                    c_type(ty)
                })
                .collect()
        };
        out.insert(name, (args, ret));
    }
    out
}

fn rust_functions() -> Signatures {
    let text = std::fs::read_to_string(root().join("src/sys.rs")).unwrap();
    let mut out = Signatures::new();
    for line in text.lines().map(str::trim).filter(|l| l.starts_with("pub fn mt_")) {
        let name = line["pub fn ".len()..line.find('(').unwrap()].to_owned();
        let args = &line[line.find('(').unwrap() + 1..line.rfind(')').unwrap()];
        let args: Vec<String> = args.split(',').filter(|a| !a.trim().is_empty()).map(|a| rust_type(a.split_once(':').unwrap().1)).collect();
        let ret = line.rsplit_once("->").map_or("void".to_owned(), |(_, r)| rust_type(r.trim_end_matches(';')));
        out.insert(name, (args, ret));
    }
    out
}

#[test]
fn c_rust_and_python_declare_every_function_alike() {
    let c = header_functions(&header());
    assert!(c.len() >= 20 && c.contains_key("mt_stream_open") && c.contains_key("mt_reset"), "{c:?}");
    let rust = rust_functions();
    let py = python_view();
    let py: Signatures = py["signatures"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(n, s)| {
            let args = s[0].as_array().unwrap().iter().map(|a| a.as_str().unwrap().to_owned()).collect();
            (n.clone(), (args, s[1].as_str().unwrap().to_owned()))
        })
        .collect();
    for (view, sigs) in [("record::sys", &rust), ("_shim.py", &py)] {
        for (name, sig) in sigs {
            assert_eq!(c.get(name), Some(sig), "{view} declares {name} as {sig:?}; the header says {:?}", c.get(name));
        }
    }
    let unbound: Vec<&String> = c.keys().filter(|n| !rust.contains_key(*n) && !py.contains_key(*n)).collect();
    assert!(unbound.is_empty(), "the header declares functions neither Rust nor Python binds: {unbound:?}");
}

/// `NAME = value` of every enumerator of the header whose name starts with `prefix`.
fn header_enum(h: &str, prefix: &str) -> BTreeMap<String, u64> {
    h.lines()
        .map(|l| l.split("//").next().unwrap().trim())
        .filter(|l| l.starts_with(prefix))
        .map(|l| {
            let (name, value) = l.trim_end_matches(',').split_once('=').unwrap();
            (name.trim().to_owned(), value.trim().parse().unwrap())
        })
        .collect()
}

#[test]
fn c_rust_and_python_number_the_frames_and_records_alike() {
    let h = header();
    let frames = header_enum(&h, "MT_FRAME_");
    let rust: BTreeMap<String, u64> = [
        ("MT_FRAME_HELLO", record::FRAME_HELLO),
        ("MT_FRAME_RECORDS", record::FRAME_RECORDS),
        ("MT_FRAME_STRINGS", record::FRAME_STRINGS),
        ("MT_FRAME_END", record::FRAME_END),
        ("MT_FRAME_NOTE", record::FRAME_NOTE),
        ("MT_FRAME_HOLDERS", record::FRAME_HOLDERS),
    ]
    .into_iter()
    .map(|(n, v)| (n.to_owned(), u64::from(v)))
    .collect();
    assert_eq!(frames, rust);
    let py = python_view();
    let py: BTreeMap<String, u64> =
        py["frames"].as_object().unwrap().iter().map(|(n, v)| (format!("MT_{n}"), v.as_u64().unwrap())).collect();
    assert_eq!(frames, py, "_shim.py's FRAME_* differ from the header's");
    let holders = header_enum(&h, "MT_HOLDER_");
    let rust_holders: BTreeMap<String, u64> = [
        ("MT_HOLDER_PARAMETER", record::MT_HOLDER_PARAMETER),
        ("MT_HOLDER_BUFFER", record::MT_HOLDER_BUFFER),
        ("MT_HOLDER_GRADIENT", record::MT_HOLDER_GRADIENT),
        ("MT_HOLDER_OPTIMIZER_STATE", record::MT_HOLDER_OPTIMIZER_STATE),
        ("MT_HOLDER_SAVED", record::MT_HOLDER_SAVED),
        ("MT_HOLDER_PENDING_FREE", record::MT_HOLDER_PENDING_FREE),
        ("MT_HOLDER_PYTHON", record::MT_HOLDER_PYTHON),
        ("MT_HOLDER_CACHE", record::MT_HOLDER_CACHE),
    ]
    .into_iter()
    .map(|(n, v)| (n.to_owned(), u64::from(v)))
    .collect();
    assert_eq!(holders, rust_holders, "holder kinds differ between the header and record::layout");
    let view = python_view();
    let py_holders: BTreeMap<String, u64> =
        view["holders"].as_object().unwrap().iter().map(|(n, v)| (format!("MT_{n}"), v.as_u64().unwrap())).collect();
    assert_eq!(holders, py_holders, "_shim.py's HOLDER_* differ from the header's");
    for (name, code) in &holders {
        assert!(shared::model::HolderKind::from_code(*code as u8).is_some(), "{name} is not a shared::model::HolderKind");
    }
    let kinds = header_enum(&h, "MT_")
        .into_iter()
        .filter(|(n, _)| !n.starts_with("MT_FRAME_") && !n.starts_with("MT_HOLDER_"))
        .collect::<BTreeMap<_, _>>();
    let rust: BTreeMap<String, u64> = [
        ("MT_MEM", record::MT_MEM),
        ("MT_OOM", record::MT_OOM),
        ("MT_OP_ENTER", record::MT_OP_ENTER),
        ("MT_OP_EXIT", record::MT_OP_EXIT),
        ("MT_TENSOR_IN", record::MT_TENSOR_IN),
        ("MT_TENSOR_OUT", record::MT_TENSOR_OUT),
        ("MT_DIMS", record::MT_DIMS),
        ("MT_SCOPE_ENTER", record::MT_SCOPE_ENTER),
        ("MT_SCOPE_EXIT", record::MT_SCOPE_EXIT),
        ("MT_MARK", record::MT_MARK),
        ("MT_USER_FRAME", record::MT_USER_FRAME),
        ("MT_USER_LINE", record::MT_USER_LINE),
        ("MT_DEVICE_MEM", record::MT_DEVICE_MEM),
    ]
    .into_iter()
    .map(|(n, v)| (n.to_owned(), u64::from(v)))
    .collect();
    assert_eq!(kinds, rust, "record kinds differ between the header and record::layout");
}

#[test]
fn the_header_parsers_read_what_they_are_given() {
    let h = "typedef struct T { uint64_t a, b; // x\n int8_t c; } T;\nint mt_f(uint64_t x, const char* s);\nvoid mt_g(void);";
    assert_eq!(header_structs(h)["T"], ["a", "b", "c"]);
    let f = header_functions(h);
    assert_eq!(f["mt_f"], (vec!["u64".to_owned(), "ptr".to_owned()], "i32".to_owned()));
    assert_eq!(f["mt_g"], (vec![], "void".to_owned()));
}

/// What travels over the socket is the C struct's bytes: reading them back gives every field.
#[test]
fn records_read_back_from_their_bytes() {
    let r = record::MtRecord {
        ts_ns: 1,
        id: 2,
        value: -3,
        a: 4,
        b: 5,
        op: 6,
        name: 7,
        thread: 8,
        kind: 9,
        device_type: -1,
        device_index: 11,
        phase: 12,
        c: 13,
    };
    // SAFETY: MtRecord is repr(C) plain data of 64 bytes without padding.
    let bytes: [u8; 64] = unsafe { std::mem::transmute(r) };
    let back = record::MtRecord::from_le_bytes(&bytes);
    assert_eq!(format!("{back:?}"), format!("{r:?}"));
}
