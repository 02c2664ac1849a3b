"""The report page: the executed report notebook rendered by nbconvert as one offline page (code
hidden, images inline, nothing fetched from a CDN), and the check that it fetches nothing."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

from dynspec.analysis.pipeline_settings import PipelineError
from dynspec.io.atomic import write_text


class _ExternalRefs(HTMLParser):
    """Collects every URL a browser would fetch from the network to show the page."""

    ATTRS = {"script": "src", "link": "href", "img": "src", "iframe": "src", "source": "src", "video": "src",
             "audio": "src", "embed": "src", "object": "data"}

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def handle_starttag(self, tag, attrs):
        want = self.ATTRS.get(tag)
        for k, v in attrs:
            if k == want and v and re.match(r"^(https?:)?//", v.strip()):
                self.found.append(f"<{tag} {k}={v}>")


def external_references(page: str) -> list[str]:
    """Network fetches a page would make: script/link/img... sources and CSS url()/@import."""
    p = _ExternalRefs()
    p.feed(page)
    css = re.findall(r"""(?:url\(\s*['"]?|@import\s+['"])((?:https?:)?//[^'")\s]+)""", page)
    return p.found + [f"css {u}" for u in css]


# Blocks of nbconvert's lab template that load scripts from CDNs: require.js, MathJax,
# Mermaid, the widget manager.  The report uses none of them.
_OFFLINE_TEMPLATE = """{%- extends 'lab/index.html.j2' -%}
{%- block html_head_js -%}{%- endblock html_head_js -%}
{%- block jupyter_widgets -%}{%- endblock jupyter_widgets -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
"""


def render_html(notebook: Path, out: Path, title: str) -> Path:
    """The executed report notebook as one self-contained page: outputs only, images inline."""
    import nbformat
    from jinja2 import DictLoader
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(template_name="lab", template_file="dynspec_offline.html.j2",
                            extra_loaders=[DictLoader({"dynspec_offline.html.j2": _OFFLINE_TEMPLATE})],
                            exclude_input=True, exclude_input_prompt=True, exclude_output_prompt=True,
                            embed_images=True)
    nb = nbformat.read(notebook, as_version=4)
    nb.metadata["title"] = title
    body, _ = exporter.from_notebook_node(nb)
    refs = external_references(body)
    if refs:
        raise PipelineError(f"{out}: the page would fetch from the network: {', '.join(refs[:3])}")
    write_text(out, body)
    return out
