//! The server's default input shapes (`protocol::run::default_shape`, used to check
//! requests without loading libtorch) are the built-in models' own.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use protocol::run::default_shape;

#[test]
fn default_shapes_are_the_models() {
    for name in protocol::MODEL_ZOO {
        let vs = tch::nn::VarStore::new(tch::Device::Cpu);
        let spec = capture::models::ModelSpec { name: name.into(), layers: None, width: None, heads: None, vocab: None, classes: None };
        let model = capture::models::build(&spec, &vs).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(default_shape(name), Some(model.default_shape.as_slice()), "{name}");
    }
}
