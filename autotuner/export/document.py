"""A small document model (headings, paragraphs, tables, images) rendered twice: Markdown beside its
PNG files, and one self-contained HTML page with the PNGs embedded as base64."""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass, field


@dataclass
class Table:
    header: list[str]
    rows: list[list[str]]


@dataclass
class Image:
    filename: str
    alt: str
    png: bytes


Block = str | Table | Image  # a str is a paragraph


@dataclass
class Section:
    title: str
    blocks: list[Block] = field(default_factory=list)


@dataclass
class Document:
    title: str
    sections: list[Section] = field(default_factory=list)
    lead: str = ""  # the verdict, the first thing a reader sees under the title


    def images(self) -> list[Image]:
        return [b for s in self.sections for b in s.blocks if isinstance(b, Image)]


def _md_line(text: str) -> str:
    """Embedded text on one line (every kind of line break folded): it cannot end a heading or a row."""
    return " ".join(text.splitlines())


def _md_cell(text: str) -> str:
    return _md_line(text).replace("|", "\\|")


def to_markdown(doc: Document) -> str:
    out = [f"# {_md_line(doc.title)}", ""]
    if doc.lead:
        out += [f"**{_md_line(doc.lead)}**", ""]
    for section in doc.sections:
        out += [f"## {_md_line(section.title)}", ""]
        for block in section.blocks:
            if isinstance(block, Table):
                out.append("| " + " | ".join(_md_cell(h) for h in block.header) + " |")
                out.append("|" + "---|" * len(block.header))
                out += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in block.rows]
            elif isinstance(block, Image):
                alt = _md_line(block.alt).replace("[", "\\[").replace("]", "\\]")
                out.append(f"![{alt}]({block.filename})")
            else:
                out.append(block)
            out.append("")
    return "\n".join(out)


# A wide table scrolls inside its own box on a phone instead of widening the page; the verdict stands out.
_STYLE = """
body { font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; padding: 0 1em; color: #222; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0 1em; display: block; overflow-x: auto;
        max-width: 100%; }
td { min-width: 5em; }
.lead { font-size: 1.1em; background: #f3f7ee; border-left: 4px solid #5a8f29; padding: 0.6em 0.9em; }
th, td { border: 1px solid #ccc; padding: 3px 7px; text-align: left; vertical-align: top; }
th { background: #f2f2f2; }
img { max-width: 100%; }
code { background: #f4f4f4; padding: 0 3px; }
"""


def to_html(doc: Document) -> str:
    e = html.escape
    out = ["<!DOCTYPE html>", "<html lang=\"en\"><head><meta charset=\"utf-8\">"
           "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">", f"<title>{e(doc.title)}</title>",
           f"<style>{_STYLE}</style></head><body>", f"<h1>{e(doc.title)}</h1>"]
    if doc.lead:
        out.append(f"<p class=\"lead\"><strong>{e(doc.lead)}</strong></p>")
    for section in doc.sections:
        out.append(f"<h2>{e(section.title)}</h2>")
        for block in section.blocks:
            if isinstance(block, Table):
                out.append("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in block.header) + "</tr>")
                out += ["<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in block.rows]
                out.append("</table>")
            elif isinstance(block, Image):
                data = base64.b64encode(block.png).decode("ascii")
                out.append(f"<p><img alt=\"{e(block.alt)}\" src=\"data:image/png;base64,{data}\"></p>")
            else:
                out.append(f"<p>{e(block)}</p>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"
