"""The models' dependency graph: build order, cycles, and selections."""

from graphlib import CycleError, TopologicalSorter

from cdc_platform.models.project import ModelError, Project


def model_deps(project: Project, name: str) -> list[str]:
    return [r.relation.table for r in project.models[name].refs if r.relation.is_model]


def build_order(project: Project) -> list[str]:
    """Every model after the models it reads; ModelError naming the files of a cycle."""
    graph = {name: model_deps(project, name) for name in sorted(project.models)}
    try:
        return list(TopologicalSorter(graph).static_order())
    except CycleError as e:
        cycle = e.args[1]  # [a, b, ..., a], each reading the one after it... in reverse
        steps = []
        for reader, read in zip(cycle[1:], cycle[:-1], strict=True):
            model = project.models[reader]
            line = next(r.line for r in model.refs if r.relation.table == read)
            steps.append(f"{model.path.name}:{line} ref('{read}')")
        names = " -> ".join(reversed(cycle))
        raise ModelError(f"models form a cycle: {names} ({'; '.join(reversed(steps))})") from None


def select(project: Project, names: list[str] | None) -> list[str]:
    """The named models (all when ``names`` is empty) in build order; unknown names fail."""
    order = build_order(project)
    if not names:
        return order
    unknown = sorted(set(names) - set(project.models))
    if unknown:
        raise ModelError(
            f"no model named {', '.join(unknown)} (models: {', '.join(sorted(project.models))})"
        )
    return [n for n in order if n in set(names)]
