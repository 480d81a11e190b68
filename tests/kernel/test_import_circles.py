"""No wide import circles: every module of the package can be read without reading the ones
that import it.

Counted with grimp (what `lint-imports` builds on) over every import, those made only for type
checking and those made inside functions included: a circle is a set of modules each of which
reaches every other one by imports (a strongly connected component). Two modules that refer to
each other (a protocol and the one type it names) are tolerated; three or more are not.
"""

from __future__ import annotations

import grimp

WIDEST = 2


def circles() -> list[list[str]]:
    graph = grimp.build_graph(
        "atmosphere_harness", include_external_packages=False, exclude_type_checking_imports=False
    )
    seen: set[str] = set()
    found: list[list[str]] = []
    for module in sorted(graph.modules):
        if module in seen:
            continue
        reached = graph.find_upstream_modules(module) & graph.find_downstream_modules(module)
        circle = reached | {module}
        seen |= circle
        if len(circle) > 1:
            found.append(sorted(circle))
    return sorted(found, key=len, reverse=True)


def test_the_widest_import_circle_has_at_most_two_modules() -> None:
    wide = [circle for circle in circles() if len(circle) > WIDEST]
    assert not wide, f"import circles wider than {WIDEST} modules: {wide}"


def test_circles_are_found() -> None:
    # The measure itself: the kernel's run and host name each other (the host starts runs, a
    # run knows its host), so at least that two-module circle is there to be found.
    assert ["atmosphere_harness._kernel.host", "atmosphere_harness._kernel.run"] in circles()
