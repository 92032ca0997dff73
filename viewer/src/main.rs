//! Entry point of the viewer: mounts the app on the page body.

fn main() {
    leptos::mount::mount_to_body(viewer::App);
}
