//! The built-in model zoo (random weights) and TorchScript models, with module paths.
//!
//! Every module runs its forward inside a layer scope named by its module path, the same
//! path PyTorch would give it (`layer1.0.conv1`, `h.3.attn.c_attn`), and is built inside the
//! same scope so its parameters' allocations are attributed to it too.

use crate::session::{self, Name};
use tch::nn::{self, ModuleT};
use tch::{Device, Kind, Tensor};

/// What to build.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelSpec {
    pub name: String,
    /// Transformer, GPT and MLP depth (blocks or hidden layers).
    pub layers: Option<i64>,
    /// Transformer, GPT and MLP width.
    pub width: Option<i64>,
    /// Attention heads (transformer, GPT).
    pub heads: Option<i64>,
    /// Vocabulary size (transformer, GPT).
    pub vocab: Option<i64>,
    /// Output classes (classifiers).
    pub classes: Option<i64>,
}

impl ModelSpec {
    pub fn named(name: &str) -> Self {
        Self { name: name.to_owned(), layers: None, width: None, heads: None, vocab: None, classes: None }
    }
}

/// The first lines of a libtorch error, without the C++ backtrace it carries.
pub fn torch_message(full: &str) -> String {
    // tch's panics quote the error with escaped newlines: `Torch("...\\nException ...")`.
    let unescaped;
    let full = if full.contains("\\n") {
        unescaped = full.replace("\\n", "\n");
        unescaped.as_str()
    } else {
        full
    };
    let full = full.split("Torch(\"").nth(1).unwrap_or(full);
    let head = full.split("\nException raised from").next().unwrap_or(full);
    let head = head.split("\nframe #").next().unwrap_or(head);
    head.trim().strip_prefix("Internal torch error: ").unwrap_or(head.trim()).to_owned()
}

/// The zoo's names, for `--help` and error messages.
pub const ZOO: [&str; 9] = protocol::MODEL_ZOO;

/// What a model takes as input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InputKind {
    /// Float images `N,C,H,W`.
    Image,
    /// Token ids `N,S` in `0..vocab`; with `embed_width`, also embeddings `N,S,embed_width`
    /// (the transformer then skips its embedding layer).
    Tokens { vocab: i64, embed_width: Option<i64> },
    /// Float features `N,F`.
    Features,
    /// TorchScript: float tensor of the given shape.
    Any,
}

/// What the loss compares against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// Class ids `N` in `0..classes`.
    Classes(i64),
    /// Next-token ids `N,S` in `0..vocab` (language model).
    NextToken(i64),
    /// The sum of the output (TorchScript models with unknown heads).
    Sum,
}

/// A model ready to run.
pub struct Model {
    pub name: String,
    pub input: InputKind,
    pub target: Target,
    pub default_shape: Vec<i64>,
    pub net: Box<dyn Net>,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model").field("name", &self.name).field("input", &self.input).finish_non_exhaustive()
    }
}

/// A network: forward with train/eval switch.
pub trait Net {
    fn forward(&self, xs: &Tensor, train: bool) -> Result<Tensor, tch::TchError>;
}

/// Why a model could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("unknown model `{0}`; built-in models: {list} (or use --torchscript FILE)", list = ZOO.join(", "))]
    Unknown(String),
    #[error("invalid input shape {shape:?} for {model}: {why}")]
    BadShape { model: String, shape: Vec<i64>, why: String },
    #[error("invalid option for {model}: {why}")]
    BadOption { model: String, why: String },
    #[error("cannot load TorchScript model {path}: {message}")]
    TorchScript { path: String, message: String },
}

/// A module path being built: the tch variable path and the dotted module name.
#[derive(Clone)]
struct P<'a> {
    vs: nn::Path<'a>,
    name: String,
}

impl<'a> P<'a> {
    fn sub(&self, s: impl std::fmt::Display) -> P<'a> {
        let s = s.to_string();
        P { vs: &self.vs / s.as_str(), name: if self.name.is_empty() { s } else { format!("{}.{s}", self.name) } }
    }
    fn scope_name(&self) -> Name {
        session::intern(&self.name)
    }
}

/// A leaf or composite module wrapped in its scope.
struct Scoped<M> {
    name: Name,
    inner: M,
}

impl<M: ModuleT> Scoped<M> {
    fn forward(&self, xs: &Tensor, train: bool) -> Tensor {
        let _g = session::scope(self.name);
        self.inner.forward_t(xs, train)
    }
}

/// Builds a module inside its own scope so its parameters are attributed to it.
fn scoped<M>(p: &P, build: impl FnOnce(&nn::Path) -> M) -> Scoped<M> {
    let name = p.scope_name();
    let _g = session::scope(name);
    Scoped { name, inner: build(&p.vs) }
}

fn conv(p: &P, i: i64, o: i64, k: i64, stride: i64, padding: i64) -> Scoped<nn::Conv2D> {
    scoped(p, |vs| nn::conv2d(vs, i, o, k, nn::ConvConfig { stride, padding, bias: false, ..Default::default() }))
}

fn conv_bias(p: &P, i: i64, o: i64, k: i64, padding: i64) -> Scoped<nn::Conv2D> {
    scoped(p, |vs| nn::conv2d(vs, i, o, k, nn::ConvConfig { padding, ..Default::default() }))
}

fn bn(p: &P, c: i64) -> Scoped<nn::BatchNorm> {
    scoped(p, |vs| nn::batch_norm2d(vs, c, Default::default()))
}

fn linear(p: &P, i: i64, o: i64) -> Scoped<nn::Linear> {
    scoped(p, |vs| nn::linear(vs, i, o, Default::default()))
}

fn layer_norm(p: &P, d: i64) -> Scoped<nn::LayerNorm> {
    scoped(p, |vs| nn::layer_norm(vs, vec![d], Default::default()))
}

/// A parameter-free function in a named scope (`relu`, `maxpool`).
struct Func {
    name: Name,
    f: fn(&Tensor, bool) -> Tensor,
}

impl Func {
    fn new(p: &P, f: fn(&Tensor, bool) -> Tensor) -> Self {
        Self { name: p.scope_name(), f }
    }
    fn forward(&self, xs: &Tensor, train: bool) -> Tensor {
        let _g = session::scope(self.name);
        (self.f)(xs, train)
    }
}

// ---------------------------------------------------------------------------------------------
// ResNet (torchvision layout)

struct Block {
    name: Name,
    conv1: Scoped<nn::Conv2D>,
    bn1: Scoped<nn::BatchNorm>,
    conv2: Scoped<nn::Conv2D>,
    bn2: Scoped<nn::BatchNorm>,
    conv3: Option<(Scoped<nn::Conv2D>, Scoped<nn::BatchNorm>)>,
    relu: Func,
    downsample: Option<(Name, Scoped<nn::Conv2D>, Scoped<nn::BatchNorm>)>,
}

impl Block {
    fn new(p: &P, cin: i64, planes: i64, stride: i64, bottleneck: bool) -> Self {
        let name = p.scope_name();
        let _g = session::scope(name);
        let expansion = if bottleneck { 4 } else { 1 };
        let cout = planes * expansion;
        let downsample = (stride != 1 || cin != cout).then(|| {
            let d = p.sub("downsample");
            let _g = session::scope(d.scope_name());
            (d.scope_name(), conv(&d.sub(0), cin, cout, 1, stride, 0), bn(&d.sub(1), cout))
        });
        if bottleneck {
            Self {
                name,
                conv1: conv(&p.sub("conv1"), cin, planes, 1, 1, 0),
                bn1: bn(&p.sub("bn1"), planes),
                conv2: conv(&p.sub("conv2"), planes, planes, 3, stride, 1),
                bn2: bn(&p.sub("bn2"), planes),
                conv3: Some((conv(&p.sub("conv3"), planes, cout, 1, 1, 0), bn(&p.sub("bn3"), cout))),
                relu: Func::new(&p.sub("relu"), |x, _| x.relu()),
                downsample,
            }
        } else {
            Self {
                name,
                conv1: conv(&p.sub("conv1"), cin, planes, 3, stride, 1),
                bn1: bn(&p.sub("bn1"), planes),
                conv2: conv(&p.sub("conv2"), planes, planes, 3, 1, 1),
                bn2: bn(&p.sub("bn2"), planes),
                conv3: None,
                relu: Func::new(&p.sub("relu"), |x, _| x.relu()),
                downsample,
            }
        }
    }

    fn forward(&self, xs: &Tensor, train: bool) -> Tensor {
        let _g = session::scope(self.name);
        let mut out = self.relu.forward(&self.bn1.forward(&self.conv1.forward(xs, train), train), train);
        out = self.bn2.forward(&self.conv2.forward(&out, train), train);
        if let Some((c3, b3)) = &self.conv3 {
            out = self.relu.forward(&out, train);
            out = b3.forward(&c3.forward(&out, train), train);
        }
        let identity = match &self.downsample {
            Some((name, c, b)) => {
                let _g = session::scope(*name);
                b.forward(&c.forward(xs, train), train)
            }
            None => xs.shallow_clone(),
        };
        self.relu.forward(&(out + identity), train)
    }
}

struct ResNet {
    conv1: Scoped<nn::Conv2D>,
    bn1: Scoped<nn::BatchNorm>,
    relu: Func,
    maxpool: Func,
    layers: Vec<(Name, Vec<Block>)>,
    avgpool: Func,
    fc: Scoped<nn::Linear>,
}

impl ResNet {
    fn new(root: &P, depths: [usize; 4], bottleneck: bool, classes: i64) -> Self {
        let expansion = if bottleneck { 4 } else { 1 };
        let mut cin = 64;
        let mut layers = Vec::new();
        let conv1 = conv(&root.sub("conv1"), 3, 64, 7, 2, 3);
        let bn1 = bn(&root.sub("bn1"), 64);
        for (i, (&n, planes)) in depths.iter().zip([64, 128, 256, 512]).enumerate() {
            let lp = root.sub(format!("layer{}", i + 1));
            let _g = session::scope(lp.scope_name());
            let mut blocks = Vec::new();
            for b in 0..n {
                let stride = if b == 0 && i > 0 { 2 } else { 1 };
                blocks.push(Block::new(&lp.sub(b), cin, planes, stride, bottleneck));
                cin = planes * expansion;
            }
            layers.push((lp.scope_name(), blocks));
        }
        Self {
            conv1,
            bn1,
            relu: Func::new(&root.sub("relu"), |x, _| x.relu()),
            maxpool: Func::new(&root.sub("maxpool"), |x, _| x.max_pool2d([3, 3], [2, 2], [1, 1], [1, 1], false)),
            layers,
            avgpool: Func::new(&root.sub("avgpool"), |x, _| x.adaptive_avg_pool2d([1, 1])),
            fc: linear(&root.sub("fc"), 512 * expansion, classes),
        }
    }
}

impl Net for ResNet {
    fn forward(&self, xs: &Tensor, train: bool) -> Result<Tensor, tch::TchError> {
        let mut x = self.conv1.forward(xs, train);
        x = self.bn1.forward(&x, train);
        x = self.relu.forward(&x, train);
        x = self.maxpool.forward(&x, train);
        for (name, blocks) in &self.layers {
            let _g = session::scope(*name);
            for b in blocks {
                x = b.forward(&x, train);
            }
        }
        x = self.avgpool.forward(&x, train).flatten(1, -1);
        Ok(self.fc.forward(&x, train))
    }
}

// ---------------------------------------------------------------------------------------------
// VGG16 (torchvision layout, no batch norm)

/// One entry of a `Sequential`.
enum Item {
    Conv(Scoped<nn::Conv2D>),
    Linear(Scoped<nn::Linear>),
    F(Func),
}

impl Item {
    fn forward(&self, xs: &Tensor, train: bool) -> Tensor {
        match self {
            Item::Conv(m) => m.forward(xs, train),
            Item::Linear(m) => m.forward(xs, train),
            Item::F(f) => f.forward(xs, train),
        }
    }
}

fn run_seq(name: Name, items: &[Item], xs: &Tensor, train: bool) -> Tensor {
    let _g = session::scope(name);
    let mut x = xs.shallow_clone();
    for item in items {
        x = item.forward(&x, train);
    }
    x
}

struct Vgg {
    features: (Name, Vec<Item>),
    avgpool: Func,
    classifier: (Name, Vec<Item>),
}

impl Vgg {
    fn new(root: &P, classes: i64) -> Self {
        const CFG: [i64; 18] = [64, 64, 0, 128, 128, 0, 256, 256, 256, 0, 512, 512, 512, 0, 512, 512, 512, 0];
        let fp = root.sub("features");
        let mut features = Vec::new();
        {
            let _g = session::scope(fp.scope_name());
            let mut cin = 3;
            let mut idx = 0;
            for c in CFG {
                if c == 0 {
                    features.push(Item::F(Func::new(&fp.sub(idx), |x, _| x.max_pool2d_default(2))));
                    idx += 1;
                } else {
                    features.push(Item::Conv(conv_bias(&fp.sub(idx), cin, c, 3, 1)));
                    features.push(Item::F(Func::new(&fp.sub(idx + 1), |x, _| x.relu())));
                    idx += 2;
                    cin = c;
                }
            }
        }
        let avgpool = Func::new(&root.sub("avgpool"), |x, _| x.adaptive_avg_pool2d([7, 7]).flatten(1, -1));
        let cp = root.sub("classifier");
        let _g = session::scope(cp.scope_name());
        let classifier = vec![
            Item::Linear(linear(&cp.sub(0), 512 * 7 * 7, 4096)),
            Item::F(Func::new(&cp.sub(1), |x, _| x.relu())),
            Item::F(Func::new(&cp.sub(2), |x, train| x.dropout(0.5, train))),
            Item::Linear(linear(&cp.sub(3), 4096, 4096)),
            Item::F(Func::new(&cp.sub(4), |x, _| x.relu())),
            Item::F(Func::new(&cp.sub(5), |x, train| x.dropout(0.5, train))),
            Item::Linear(linear(&cp.sub(6), 4096, classes)),
        ];
        Self { features: (fp.scope_name(), features), avgpool, classifier: (cp.scope_name(), classifier) }
    }
}

impl Net for Vgg {
    fn forward(&self, xs: &Tensor, train: bool) -> Result<Tensor, tch::TchError> {
        let x = run_seq(self.features.0, &self.features.1, xs, train);
        let x = self.avgpool.forward(&x, train);
        Ok(run_seq(self.classifier.0, &self.classifier.1, &x, train))
    }
}

// ---------------------------------------------------------------------------------------------
// Transformers: an encoder classifier (nn.TransformerEncoderLayer layout) and a GPT-2 style
// decoder (Hugging Face GPT-2 layout).

struct Attention {
    name: Name,
    qkv: Scoped<nn::Linear>,
    proj: Scoped<nn::Linear>,
    heads: i64,
    causal: bool,
}

impl Attention {
    fn new(p: &P, qkv: &str, proj: &str, width: i64, heads: i64, causal: bool) -> Self {
        let name = p.scope_name();
        let _g = session::scope(name);
        Self { name, qkv: linear(&p.sub(qkv), width, 3 * width), proj: linear(&p.sub(proj), width, width), heads, causal }
    }

    fn forward(&self, xs: &Tensor, train: bool) -> Tensor {
        let _g = session::scope(self.name);
        let (b, t, c) = xs.size3().unwrap_or((1, 1, 1));
        let qkv = self.qkv.forward(xs, train);
        let parts = qkv.split(c, 2);
        let heads = |x: &Tensor| x.view([b, t, self.heads, c / self.heads]).transpose(1, 2);
        let (q, k, v) = (heads(&parts[0]), heads(&parts[1]), heads(&parts[2]));
        let y = Tensor::scaled_dot_product_attention::<Tensor>(&q, &k, &v, None, 0.0, self.causal, None, false);
        let y = y.transpose(1, 2).contiguous().view([b, t, c]);
        self.proj.forward(&y, train)
    }
}

struct EncoderLayer {
    name: Name,
    self_attn: Attention,
    linear1: Scoped<nn::Linear>,
    linear2: Scoped<nn::Linear>,
    norm1: Scoped<nn::LayerNorm>,
    norm2: Scoped<nn::LayerNorm>,
}

struct Transformer {
    embedding: Scoped<nn::Embedding>,
    layers: (Name, Vec<EncoderLayer>),
    head: Scoped<nn::Linear>,
}

impl Transformer {
    fn new(root: &P, layers: i64, width: i64, heads: i64, vocab: i64, classes: i64) -> Self {
        let embedding = scoped(&root.sub("embedding"), |vs| nn::embedding(vs, vocab, width, Default::default()));
        let lp = root.sub("encoder").sub("layers");
        let mut blocks = Vec::new();
        {
            let _g = session::scope(lp.scope_name());
            for i in 0..layers {
                let p = lp.sub(i);
                let name = p.scope_name();
                let _g = session::scope(name);
                blocks.push(EncoderLayer {
                    name,
                    self_attn: Attention::new(&p.sub("self_attn"), "in_proj", "out_proj", width, heads, false),
                    linear1: linear(&p.sub("linear1"), width, 4 * width),
                    linear2: linear(&p.sub("linear2"), 4 * width, width),
                    norm1: layer_norm(&p.sub("norm1"), width),
                    norm2: layer_norm(&p.sub("norm2"), width),
                });
            }
        }
        Self { embedding, layers: (lp.scope_name(), blocks), head: linear(&root.sub("head"), width, classes) }
    }
}

impl Net for Transformer {
    fn forward(&self, xs: &Tensor, train: bool) -> Result<Tensor, tch::TchError> {
        // Token ids go through the embedding; embeddings (batch, sequence, width) come in as is.
        let mut x = if xs.dim() == 3 { xs.shallow_clone() } else { self.embedding.forward(xs, train) };
        {
            let _g = session::scope(self.layers.0);
            for l in &self.layers.1 {
                let _g = session::scope(l.name);
                // Post-norm, as nn.TransformerEncoderLayer's default.
                x = l.norm1.forward(&(&x + l.self_attn.forward(&x, train).dropout(0.1, train)), train);
                let ff = l.linear2.forward(&l.linear1.forward(&x, train).relu().dropout(0.1, train), train);
                x = l.norm2.forward(&(&x + ff.dropout(0.1, train)), train);
            }
        }
        Ok(self.head.forward(&x.mean_dim(1, false, None), train))
    }
}

struct GptBlock {
    name: Name,
    ln_1: Scoped<nn::LayerNorm>,
    attn: Attention,
    ln_2: Scoped<nn::LayerNorm>,
    mlp: (Name, Scoped<nn::Linear>, Scoped<nn::Linear>),
}

struct Gpt {
    wte: Scoped<nn::Embedding>,
    wpe: Scoped<nn::Embedding>,
    h: (Name, Vec<GptBlock>),
    ln_f: Scoped<nn::LayerNorm>,
    lm_head: Scoped<nn::Linear>,
}

impl Gpt {
    fn new(root: &P, layers: i64, width: i64, heads: i64, vocab: i64, max_len: i64) -> Self {
        let wte = scoped(&root.sub("wte"), |vs| nn::embedding(vs, vocab, width, Default::default()));
        let wpe = scoped(&root.sub("wpe"), |vs| nn::embedding(vs, max_len, width, Default::default()));
        let hp = root.sub("h");
        let mut blocks = Vec::new();
        {
            let _g = session::scope(hp.scope_name());
            for i in 0..layers {
                let p = hp.sub(i);
                let name = p.scope_name();
                let _g = session::scope(name);
                let mp = p.sub("mlp");
                let mlp = {
                    let _g = session::scope(mp.scope_name());
                    (mp.scope_name(), linear(&mp.sub("c_fc"), width, 4 * width), linear(&mp.sub("c_proj"), 4 * width, width))
                };
                blocks.push(GptBlock {
                    name,
                    ln_1: layer_norm(&p.sub("ln_1"), width),
                    attn: Attention::new(&p.sub("attn"), "c_attn", "c_proj", width, heads, true),
                    ln_2: layer_norm(&p.sub("ln_2"), width),
                    mlp,
                });
            }
        }
        Self {
            wte,
            wpe,
            h: (hp.scope_name(), blocks),
            ln_f: layer_norm(&root.sub("ln_f"), width),
            lm_head: scoped(&root.sub("lm_head"), |vs| {
                nn::linear(vs, width, vocab, nn::LinearConfig { bias: false, ..Default::default() })
            }),
        }
    }
}

impl Net for Gpt {
    fn forward(&self, xs: &Tensor, train: bool) -> Result<Tensor, tch::TchError> {
        let t = xs.size().get(1).copied().unwrap_or(1);
        let pos = Tensor::arange(t, (Kind::Int64, xs.device()));
        let mut x = self.wte.forward(xs, train) + self.wpe.forward(&pos, train);
        {
            let _g = session::scope(self.h.0);
            for b in &self.h.1 {
                let _g = session::scope(b.name);
                x = &x + b.attn.forward(&b.ln_1.forward(&x, train), train);
                let (mlp, fc, proj) = &b.mlp;
                let m = {
                    let _g = session::scope(*mlp);
                    proj.forward(&fc.forward(&b.ln_2.forward(&x, train), train).gelu("tanh"), train)
                };
                x = &x + m;
            }
        }
        Ok(self.lm_head.forward(&self.ln_f.forward(&x, train), train))
    }
}

// ---------------------------------------------------------------------------------------------
// MLP

struct Mlp {
    layers: Vec<(Scoped<nn::Linear>, Func)>,
    out: Scoped<nn::Linear>,
}

impl Mlp {
    fn new(root: &P, inputs: i64, layers: i64, width: i64, classes: i64) -> Self {
        let mut cin = inputs;
        let mut hidden = Vec::new();
        for i in 0..layers {
            hidden.push((
                linear(&root.sub(format!("fc{}", i + 1)), cin, width),
                Func::new(&root.sub(format!("relu{}", i + 1)), |x, _| x.relu()),
            ));
            cin = width;
        }
        Self { layers: hidden, out: linear(&root.sub("out"), cin, classes) }
    }
}

impl Net for Mlp {
    fn forward(&self, xs: &Tensor, train: bool) -> Result<Tensor, tch::TchError> {
        let mut x = xs.flatten(1, -1);
        for (fc, relu) in &self.layers {
            x = relu.forward(&fc.forward(&x, train), train);
        }
        Ok(self.out.forward(&x, train))
    }
}

// ---------------------------------------------------------------------------------------------
// TorchScript

struct Script {
    module: tch::TrainableCModule,
}

impl Net for Script {
    fn forward(&self, xs: &Tensor, _train: bool) -> Result<Tensor, tch::TchError> {
        self.module.forward_ts(&[xs])
    }
}

/// Builds a zoo model with random weights in `vs`.
pub fn build(spec: &ModelSpec, vs: &nn::VarStore) -> Result<Model, ModelError> {
    let root = P { vs: vs.root(), name: String::new() };
    let classes = spec.classes.unwrap_or(1000);
    let bad = |why: &str| ModelError::BadOption { model: spec.name.clone(), why: why.to_owned() };
    if classes < 1 {
        return Err(bad("--classes must be at least 1"));
    }
    let resnet = |depths: [usize; 4], bottleneck: bool| -> Box<dyn Net> { Box::new(ResNet::new(&root, depths, bottleneck, classes)) };
    let image = |net: Box<dyn Net>| Model {
        name: spec.name.clone(),
        input: InputKind::Image,
        target: Target::Classes(classes),
        default_shape: vec![8, 3, 224, 224],
        net,
    };
    let layers = spec.layers.unwrap_or(match spec.name.as_str() {
        "mlp" => 3,
        "gpt" => 12,
        _ => 6,
    });
    let width = spec.width.unwrap_or(match spec.name.as_str() {
        "mlp" => 1024,
        "gpt" => 768,
        _ => 512,
    });
    let heads = spec.heads.unwrap_or(if spec.name == "gpt" { 12 } else { 8 });
    let vocab = spec.vocab.unwrap_or(if spec.name == "gpt" { 50257 } else { 32000 });
    if !(1..=1000).contains(&layers) {
        return Err(bad("--layers must be between 1 and 1000"));
    }
    if !(1..=65536).contains(&width) || !(1..=1024).contains(&heads) || width % heads != 0 {
        return Err(bad("--width must be between 1 and 65536 and a multiple of --heads (1..=1024)"));
    }
    if !(2..=1_000_000).contains(&vocab) {
        return Err(bad("--vocab must be between 2 and 1000000"));
    }
    Ok(match spec.name.as_str() {
        "resnet18" => image(resnet([2, 2, 2, 2], false)),
        "resnet34" => image(resnet([3, 4, 6, 3], false)),
        "resnet50" => image(resnet([3, 4, 6, 3], true)),
        "resnet101" => image(resnet([3, 4, 23, 3], true)),
        "resnet152" => image(resnet([3, 8, 36, 3], true)),
        "vgg16" => image(Box::new(Vgg::new(&root, classes))),
        "transformer" => Model {
            name: spec.name.clone(),
            input: InputKind::Tokens { vocab, embed_width: Some(width) },
            target: Target::Classes(classes),
            default_shape: vec![8, 512],
            net: Box::new(Transformer::new(&root, layers, width, heads, vocab, classes)),
        },
        "gpt" => Model {
            name: spec.name.clone(),
            input: InputKind::Tokens { vocab, embed_width: None },
            target: Target::NextToken(vocab),
            default_shape: vec![8, 1024],
            net: Box::new(Gpt::new(&root, layers, width, heads, vocab, 1024)),
        },
        "mlp" => Model {
            name: spec.name.clone(),
            input: InputKind::Features,
            target: Target::Classes(classes),
            default_shape: vec![64, 784],
            net: Box::new(Mlp::new(&root, 784, layers, width, classes)),
        },
        other => return Err(ModelError::Unknown(other.to_owned())),
    })
}

/// Loads a TorchScript model; its parameters join `vs` so optimizers train them.
pub fn load_torchscript(path: &std::path::Path, vs: &nn::VarStore) -> Result<Model, ModelError> {
    let module = tch::TrainableCModule::load(path, vs.root())
        .map_err(|e| ModelError::TorchScript { path: path.display().to_string(), message: torch_message(&e.to_string()) })?;
    Ok(Model {
        name: path.file_stem().map_or_else(|| "torchscript".into(), |s| s.to_string_lossy().into_owned()),
        input: InputKind::Any,
        target: Target::Sum,
        default_shape: Vec::new(),
        net: Box::new(Script { module }),
    })
}

impl Model {
    /// Checks `shape` against what the model takes; the model's default when empty.
    pub fn resolve_shape(&self, shape: Option<&[i64]>, batch: Option<i64>) -> Result<Vec<i64>, ModelError> {
        let mut shape = match shape {
            Some(s) => s.to_vec(),
            None if self.default_shape.is_empty() => {
                return Err(self.shape_error(&[], "a TorchScript model needs --input-shape"));
            }
            None => self.default_shape.clone(),
        };
        if let Some(b) = batch {
            if shape.is_empty() {
                return Err(self.shape_error(&shape, "--batch-size needs a shape to replace the first dimension of"));
            }
            shape[0] = b;
        }
        if shape.iter().any(|&d| d < 1) {
            return Err(self.shape_error(&shape, "every dimension must be at least 1"));
        }
        let elements = shape.iter().try_fold(1i64, |acc, &d| acc.checked_mul(d));
        if elements.is_none_or(|n| n > (1 << 34)) {
            return Err(self.shape_error(&shape, "more than 2^34 elements"));
        }
        let expect = |n: usize, what: &str| -> Result<(), ModelError> {
            if shape.len() == n {
                Ok(())
            } else {
                Err(self.shape_error(&shape, &format!("expected {n} dimensions ({what})")))
            }
        };
        match self.input {
            InputKind::Image => {
                expect(4, "batch,channels,height,width, e.g. 8,3,224,224")?;
                if shape[1] != 3 {
                    return Err(self.shape_error(&shape, "the model takes 3 input channels"));
                }
                if shape[2] < 32 || shape[3] < 32 {
                    return Err(self.shape_error(&shape, "height and width must be at least 32"));
                }
            }
            InputKind::Tokens { embed_width: Some(w), .. } if shape.len() == 3 => {
                if shape[2] != w {
                    return Err(self.shape_error(&shape, &format!("embeddings must be {w} wide (the model's width)")));
                }
            }
            InputKind::Tokens { embed_width, .. } => {
                let what = if embed_width.is_some() {
                    "batch,sequence_length of token ids, e.g. 8,512, or batch,sequence,width of embeddings, e.g. 4,128,512"
                } else {
                    "batch,sequence_length, e.g. 8,512"
                };
                expect(2, what)?;
                if self.name == "gpt" && shape[1] > 1024 {
                    return Err(self.shape_error(&shape, "gpt takes at most 1024 positions"));
                }
            }
            InputKind::Features => {
                expect(2, "batch,features, e.g. 64,784")?;
                if shape[1] != 784 {
                    return Err(self.shape_error(&shape, "the mlp takes 784 input features"));
                }
            }
            InputKind::Any => {}
        }
        Ok(shape)
    }

    fn shape_error(&self, shape: &[i64], why: &str) -> ModelError {
        ModelError::BadShape { model: self.name.clone(), shape: shape.to_vec(), why: why.to_owned() }
    }

    /// A random input batch of `shape` on `device`.
    pub fn input(&self, shape: &[i64], device: Device) -> Tensor {
        match self.input {
            InputKind::Tokens { embed_width: Some(_), .. } if shape.len() == 3 => Tensor::randn(shape, (Kind::Float, device)),
            InputKind::Tokens { vocab, .. } => Tensor::randint(vocab, shape, (Kind::Int64, device)),
            _ => Tensor::randn(shape, (Kind::Float, device)),
        }
    }

    /// Random targets for a batch of `shape`.
    pub fn targets(&self, shape: &[i64], device: Device) -> Option<Tensor> {
        match self.target {
            Target::Classes(n) => Some(Tensor::randint(n, [shape[0]], (Kind::Int64, device))),
            Target::NextToken(v) => Some(Tensor::randint(v, shape, (Kind::Int64, device))),
            Target::Sum => None,
        }
    }

    /// The training loss of `output` against `targets`.
    pub fn loss(&self, output: &Tensor, targets: Option<&Tensor>) -> Tensor {
        match (self.target, targets) {
            (Target::Classes(_), Some(t)) => output.cross_entropy_for_logits(t),
            (Target::NextToken(v), Some(t)) => output.view([-1, v]).cross_entropy_for_logits(&t.view([-1])),
            _ => output.to_kind(Kind::Float).sum(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::torch_message;

    #[test]
    fn torch_messages_lose_the_backtrace() {
        let panic = r#"called `Result::unwrap()` on an `Err` value: Torch("CUDA out of memory. Tried to allocate 2.00 GiB.\nException raised from malloc at /pytorch/c10/cuda/CUDACachingAllocator.cpp:1\nframe #0: c10::Error::Error")"#;
        assert_eq!(torch_message(panic), "CUDA out of memory. Tried to allocate 2.00 GiB.");
        let plain = "Internal torch error: open file failed\nException raised from RAIIFile\nframe #0: x";
        assert_eq!(torch_message(plain), "open file failed");
    }
}
