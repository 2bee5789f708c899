"""The `arkinfer` console script: what must happen before anything heavy is imported (the process
restarts itself with glibc's huge-page malloc, arkinfer/huge_pages.py), then the CLI itself
(arkinfer/cli/main.py)."""

from __future__ import annotations


def main() -> None:
    from arkinfer.huge_pages import reexec_with_huge_page_malloc

    reexec_with_huge_page_malloc()
    from arkinfer.cli.main import main as cli_main

    cli_main()
