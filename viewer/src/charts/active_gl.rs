//! The Active Memory Timeline's bands on the GPU (WebGL2): each run of a band (columns at one
//! bottom) is one instanced quad in column units, uploaded once per answer as packed typed
//! arrays; a zoom or pan redraws at once by changing the uniform that maps columns to the
//! screen, before the worker answers for the new window. Where the browser has no WebGL2
//! (`get_context("webgl2")` gives none, as headless Chromium with `--disable-gpu` does), the
//! view draws with plotters instead (`active.rs`).

use super::{band_outline, before_trace_runs, Palette};
use plotters::style::RGBColor;
use shared::analysis::active::ActiveTimeline;
use wasm_bindgen::JsCast;
use web_sys::{HtmlCanvasElement, WebGl2RenderingContext as Gl, WebGlBuffer, WebGlProgram, WebGlUniformLocation, WebGlVertexArrayObject};

/// A quad per instance: corners from `gl_VertexID` (a triangle strip of 4), x in columns
/// mapped by `x_map`, y already 0..1 of the plot's height.
const QUAD_VS: &str = "#version 300 es
layout(location = 0) in vec4 rect;
layout(location = 1) in vec4 colour;
uniform vec2 x_map;
out vec4 v_colour;
void main() {
    float x = (gl_VertexID & 1) == 0 ? rect.x : rect.y;
    float y = (gl_VertexID & 2) == 0 ? rect.z : rect.w;
    gl_Position = vec4(x * x_map.x + x_map.y, y * 2.0 - 1.0, 0.0, 1.0);
    v_colour = colour;
}";

const LINE_VS: &str = "#version 300 es
layout(location = 0) in vec2 point;
uniform vec2 x_map;
void main() {
    gl_Position = vec4(point.x * x_map.x + x_map.y, point.y * 2.0 - 1.0, 0.0, 1.0);
}";

const COLOUR_FS: &str = "#version 300 es
precision mediump float;
in vec4 v_colour;
out vec4 colour;
void main() { colour = v_colour; }";

const FLAT_FS: &str = "#version 300 es
precision mediump float;
uniform vec4 flat_colour;
out vec4 colour;
void main() { colour = flat_colour; }";

/// The quads of one answer, as uploaded: per quad its rectangle (first column, column after
/// the last, bottom and top as fractions of the plot's height) and the band it draws
/// (`u32::MAX`: the memory from before the trace).
#[derive(Clone, Debug, Default)]
pub struct Quads {
    pub rects: Vec<f32>,
    pub band: Vec<u32>,
}

impl Quads {
    /// The quads of `a` with bytes over `ymax` (the plot's top).
    pub fn of(a: &ActiveTimeline, ymax: f64) -> Self {
        let bands = &a.bands;
        let y = |bytes: u64| (bytes as f64 / ymax.max(1.0)) as f32;
        let runs = bands.run_column.len();
        let mut q = Quads { rects: Vec::with_capacity(runs * 4 + 64), band: Vec::with_capacity(runs + 16) };
        for (c0, c1, v) in before_trace_runs(a) {
            q.rects.extend([c0 as f32, c1 as f32, 0.0, y(v)]);
            q.band.push(u32::MAX);
        }
        for b in 0..bands.len() {
            let size = bands.size_bytes[b];
            for r in bands.runs(b) {
                let bottom = bands.run_bottom[r];
                q.rects.extend([bands.run_column[r] as f32, bands.run_end(r) as f32, y(bottom), y(bottom + size)]);
                q.band.push(b as u32);
            }
        }
        q
    }

    pub fn len(&self) -> usize {
        self.band.len()
    }

    pub fn is_empty(&self) -> bool {
        self.band.is_empty()
    }
}

/// The uniform mapping columns of an answer over `data` (seconds) to clip space when the plot
/// shows `view`: what a zoom or pan changes before the worker answers.
pub fn x_map(data: (f64, f64), columns: usize, view: (f64, f64)) -> (f32, f32) {
    let (d, v) = ((data.1 - data.0).max(1e-12), (view.1 - view.0).max(1e-12));
    let scale = 2.0 * d / (columns.max(1) as f64 * v);
    let offset = 2.0 * (data.0 - view.0) / v - 1.0;
    (scale as f32, offset as f32)
}

/// A WebGL2 context on the canvas over the plot, its programs and buffers.
pub struct ActiveGl {
    gl: Gl,
    quads: Program,
    lines: Program,
    rects: WebGlBuffer,
    colours: WebGlBuffer,
    outline: WebGlBuffer,
    quad_vao: WebGlVertexArrayObject,
    line_vao: WebGlVertexArrayObject,
    instances: i32,
    outline_points: i32,
}

struct Program {
    program: WebGlProgram,
    x_map: Option<WebGlUniformLocation>,
    flat_colour: Option<WebGlUniformLocation>,
}

fn program(gl: &Gl, vs: &str, fs: &str) -> Result<Program, String> {
    let compile = |kind: u32, source: &str| -> Result<web_sys::WebGlShader, String> {
        let shader = gl.create_shader(kind).ok_or("no shader")?;
        gl.shader_source(&shader, source);
        gl.compile_shader(&shader);
        if gl.get_shader_parameter(&shader, Gl::COMPILE_STATUS).as_bool() == Some(true) {
            Ok(shader)
        } else {
            Err(gl.get_shader_info_log(&shader).unwrap_or_default())
        }
    };
    let program = gl.create_program().ok_or("no program")?;
    gl.attach_shader(&program, &compile(Gl::VERTEX_SHADER, vs)?);
    gl.attach_shader(&program, &compile(Gl::FRAGMENT_SHADER, fs)?);
    gl.link_program(&program);
    if gl.get_program_parameter(&program, Gl::LINK_STATUS).as_bool() != Some(true) {
        return Err(gl.get_program_info_log(&program).unwrap_or_default());
    }
    let x_map = gl.get_uniform_location(&program, "x_map");
    let flat_colour = gl.get_uniform_location(&program, "flat_colour");
    Ok(Program { program, x_map, flat_colour })
}

fn rgba(c: RGBColor, alpha: f32) -> [f32; 4] {
    [c.0 as f32 / 255.0, c.1 as f32 / 255.0, c.2 as f32 / 255.0, alpha]
}

impl ActiveGl {
    /// WebGL2 on `canvas`, or why not (no WebGL2 in this browser, a shader refused). Unless
    /// `software` is allowed, a WebGL2 drawn on the CPU (SwiftShader, as headless Chromium
    /// offers with `--enable-unsafe-swiftshader`) is refused too: measured on the 2-core VM, it
    /// drew a frame of 327 k bands in 0.95 s where the 2D canvas path took 0.08 s
    /// (`docs/benchmarks.md`).
    pub fn new(canvas: &HtmlCanvasElement, software: bool) -> Result<Self, String> {
        let options = js_sys::Object::new();
        let _ = js_sys::Reflect::set(&options, &"failIfMajorPerformanceCaveat".into(), &(!software).into());
        // Kept after a frame: the PNG and the tests read the pixels back.
        let _ = js_sys::Reflect::set(&options, &"preserveDrawingBuffer".into(), &true.into());
        let _ = js_sys::Reflect::set(&options, &"antialias".into(), &false.into());
        let gl: Gl = canvas
            .get_context_with_context_options("webgl2", &options)
            .ok()
            .flatten()
            .and_then(|c| c.dyn_into().ok())
            .ok_or("this browser has no WebGL2 drawn by a GPU")?;
        let quads = program(&gl, QUAD_VS, COLOUR_FS)?;
        let lines = program(&gl, LINE_VS, FLAT_FS)?;
        let buffer = || gl.create_buffer().ok_or("no buffer");
        let (rects, colours, outline) = (buffer()?, buffer()?, buffer()?);
        let quad_vao = gl.create_vertex_array().ok_or("no vertex array")?;
        gl.bind_vertex_array(Some(&quad_vao));
        gl.bind_buffer(Gl::ARRAY_BUFFER, Some(&rects));
        gl.enable_vertex_attrib_array(0);
        gl.vertex_attrib_pointer_with_i32(0, 4, Gl::FLOAT, false, 0, 0);
        gl.vertex_attrib_divisor(0, 1);
        gl.bind_buffer(Gl::ARRAY_BUFFER, Some(&colours));
        gl.enable_vertex_attrib_array(1);
        gl.vertex_attrib_pointer_with_i32(1, 4, Gl::UNSIGNED_BYTE, true, 0, 0);
        gl.vertex_attrib_divisor(1, 1);
        let line_vao = gl.create_vertex_array().ok_or("no vertex array")?;
        gl.bind_vertex_array(Some(&line_vao));
        gl.bind_buffer(Gl::ARRAY_BUFFER, Some(&outline));
        gl.enable_vertex_attrib_array(0);
        gl.vertex_attrib_pointer_with_i32(0, 2, Gl::FLOAT, false, 0, 0);
        gl.bind_vertex_array(None);
        gl.enable(Gl::BLEND);
        // Colours blend over the background as the 2D canvas blends them, and the canvas stays
        // opaque: with `blend_func` alone a dimmed band (a fifth opaque) left the drawing
        // buffer's alpha below 1, and the page composited it as premultiplied, so on the light
        // theme the bands a pin dims came out white, erased where the 2D canvas dims them.
        gl.blend_func_separate(Gl::SRC_ALPHA, Gl::ONE_MINUS_SRC_ALPHA, Gl::ONE, Gl::ONE_MINUS_SRC_ALPHA);
        Ok(Self { gl, quads, lines, rects, colours, outline, quad_vao, line_vao, instances: 0, outline_points: 0 })
    }

    /// Uploads the quads' rectangles (once per answer).
    pub fn upload_quads(&mut self, q: &Quads) {
        self.gl.bind_buffer(Gl::ARRAY_BUFFER, Some(&self.rects));
        self.gl.buffer_data_with_array_buffer_view(Gl::ARRAY_BUFFER, &js_sys::Float32Array::from(&q.rects[..]), Gl::STATIC_DRAW);
        self.instances = q.len() as i32;
    }

    /// Uploads each quad's colour (again when the colouring, the pin or the search change):
    /// its band's, a fifth as opaque where dimmed; the memory from before the trace in grey.
    pub fn upload_colours(&mut self, q: &Quads, styles: &[(RGBColor, bool)], pal: &Palette) {
        let grey = pal.grid;
        let mut bytes = Vec::with_capacity(q.len() * 4);
        for &b in &q.band {
            let (c, alpha) = match styles.get(b as usize) {
                Some(&(c, dim)) => (c, if dim { 51 } else { 255 }),
                None => (grey, 230),
            };
            bytes.extend([c.0, c.1, c.2, alpha]);
        }
        self.gl.bind_buffer(Gl::ARRAY_BUFFER, Some(&self.colours));
        self.gl.buffer_data_with_array_buffer_view(Gl::ARRAY_BUFFER, &js_sys::Uint8Array::from(&bytes[..]), Gl::STATIC_DRAW);
    }

    /// Uploads the pinned band's outline (none: `pinned` is `None`).
    pub fn upload_outline(&mut self, a: &ActiveTimeline, pinned: Option<usize>, ymax: f64) {
        let mut points: Vec<f32> = Vec::new();
        if let Some(b) = pinned.filter(|&b| b < a.bands.len()) {
            let pts = band_outline(&a.bands, b);
            for (c, bytes) in pts.iter().chain(pts.first()) {
                points.extend([*c as f32, (bytes / ymax.max(1.0)) as f32]);
            }
        }
        self.gl.bind_buffer(Gl::ARRAY_BUFFER, Some(&self.outline));
        self.gl.buffer_data_with_array_buffer_view(Gl::ARRAY_BUFFER, &js_sys::Float32Array::from(&points[..]), Gl::STATIC_DRAW);
        self.outline_points = (points.len() / 2) as i32;
    }

    /// Draws what was uploaded with `x_map` ([`x_map`]) on the theme's background; `finish`:
    /// waits until it is drawn (to time a frame).
    pub fn draw(&self, x_map: (f32, f32), pal: &Palette, finish: bool) {
        let gl = &self.gl;
        if let Some(c) = gl.canvas().and_then(|c| c.dyn_into::<HtmlCanvasElement>().ok()) {
            gl.viewport(0, 0, c.width() as i32, c.height() as i32);
        }
        let [r, g, b, a] = rgba(pal.background, 1.0);
        gl.clear_color(r, g, b, a);
        gl.clear(Gl::COLOR_BUFFER_BIT);
        gl.use_program(Some(&self.quads.program));
        gl.uniform2f(self.quads.x_map.as_ref(), x_map.0, x_map.1);
        gl.bind_vertex_array(Some(&self.quad_vao));
        gl.draw_arrays_instanced(Gl::TRIANGLE_STRIP, 0, 4, self.instances);
        if self.outline_points > 1 {
            gl.use_program(Some(&self.lines.program));
            gl.uniform2f(self.lines.x_map.as_ref(), x_map.0, x_map.1);
            let [r, g, b, a] = rgba(pal.highlight, 1.0);
            gl.uniform4f(self.lines.flat_colour.as_ref(), r, g, b, a);
            gl.bind_vertex_array(Some(&self.line_vao));
            gl.draw_arrays(Gl::LINE_STRIP, 0, self.outline_points);
        }
        gl.bind_vertex_array(None);
        if finish {
            // Reading a pixel back waits until the frame is drawn (`finish` alone may return
            // before a software renderer has run the draw).
            let mut pixel = [0u8; 4];
            let _ = gl.read_pixels_with_opt_u8_array(0, 0, 1, 1, Gl::RGBA, Gl::UNSIGNED_BYTE, Some(&mut pixel));
        }
    }
}
