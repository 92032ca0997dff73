//! The trace shown in another format, as text for the page to download.

use super::{Response, Session};

impl Session {
    pub(super) fn export(&self, format: &str) -> Response {
        let stem = match &self.rank {
            Some((r, _)) => format!("{}.rank{r}", self.export_stem),
            None => self.export_stem.clone(),
        };
        let (text, file_name, mime) = if format == "layers_csv" {
            let mut out = Vec::new();
            let r = crate::export::csv::write_layer_stats(self.trace(), &mut out);
            (r.map(|_| out), format!("{stem}.layers.csv"), "text/csv")
        } else {
            let Some(f) = crate::export::ExportFormat::from_name(format) else {
                return Response::Error {
                    message: format!("unknown export format {format:?}: expected speedscope, timeline, chrome, csv, native or layers_csv"),
                };
            };
            if f == crate::export::ExportFormat::Dftracer {
                // Answers carry text; a gzip file is not.
                return Response::Error {
                    message: "DFTracer .pfw.gz is binary: export it with `collector convert TRACE -o run.pfw.gz` or the server's /api/trace/export".into(),
                };
            }
            let mut out = Vec::new();
            let r = crate::export::export(self.trace(), f, &mut out);
            let mime = if f == crate::export::ExportFormat::Csv { "text/csv" } else { "application/json" };
            (r.map(|_| out), format!("{stem}.{}", f.extension()), mime)
        };
        match text {
            Ok(bytes) => Response::Export { file_name, mime: mime.into(), text: String::from_utf8_lossy(&bytes).into_owned() },
            Err(e) => Response::Error { message: e.to_string() },
        }
    }
}
