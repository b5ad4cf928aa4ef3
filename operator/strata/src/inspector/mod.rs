//! The Context Inspector page: one self-contained HTML document (inline SVG, vanilla JS, no external
//! assets) that the gateway serves live and `strata replay --html` writes with its data embedded.

use serde_json::Value;

/// The page. Served as is, it loads `status`, `entries` and `inspect` relative to its own URL.
pub const PAGE: &str = include_str!("page.html");

/// The page's own script, before which embedded data is inserted (the script reads it on load).
const PAGE_SCRIPT: &str = "<script>\n\"use strict\";";

/// The page with `view` embedded, for reading offline. `view` holds the documents the live page
/// fetches, in the same shapes: `{"status": …, "entries": …, "inspect": …, "source": "…"}`.
pub fn offline_page(view: &Value) -> String {
    // `<` is escaped so that no string in the data can close the script element.
    let data = view.to_string().replace('<', "\\u003c");
    let script = format!("<script id=\"strata-data\" type=\"application/json\">{data}</script>\n");
    match PAGE.find(PAGE_SCRIPT) {
        Some(at) => format!("{}{script}{}", &PAGE[..at], &PAGE[at..]),
        None => format!("{PAGE}{script}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_data_comes_before_the_script_and_cannot_close_it() {
        let page = offline_page(&serde_json::json!({"source": "</script><script>alert(1)</script>"}));
        let data_at = page.find("id=\"strata-data\"").expect("data embedded");
        let script_at = page.find("\"use strict\"").expect("page script");
        assert!(data_at < script_at, "the page script reads the data on load");
        assert!(!page.contains("</script><script>alert(1)"), "the title cannot close the data element");
        assert!(page.contains("\\u003c/script>"));
    }

    #[test]
    fn the_page_loads_nothing_from_elsewhere() {
        for forbidden in ["http://", "https://", "src=\"", "<link", "@import"] {
            let allowed_svg_namespace = forbidden == "http://"
                && PAGE.matches("http://").count() == 1
                && PAGE.contains("http://www.w3.org/2000/svg");
            assert!(!PAGE.contains(forbidden) || allowed_svg_namespace, "page references {forbidden}");
        }
    }
}
