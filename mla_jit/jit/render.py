"""Jinja2 rendering of kernel instantiations. Templates only instantiate; logic lives in headers."""
from __future__ import annotations

import functools
from typing import Any

import jinja2

from .paths import TEMPLATES_DIR


@functools.lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES_DIR)),
        undefined=jinja2.StrictUndefined,  # a missing parameter is an error, never an empty string
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )


def render(template_name: str, context: dict[str, Any]) -> str:
    return _environment().get_template(template_name).render(**context)


def template_names() -> list[str]:
    return sorted(_environment().list_templates(filter_func=lambda n: n.endswith(".cu.j2")))
