"""docs/configuration-reference.md is what the catalog's models say now."""

from pathlib import Path

from cdc_platform import config_reference

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "configuration-reference.md"


def test_every_setting_is_described():
    for model, _ in config_reference.BLOCKS:
        for name, field in model.model_fields.items():
            assert field.exclude or field.description, f"{model.__name__}.{name}: no description"


def test_the_reference_is_up_to_date():
    assert REFERENCE.read_text() == config_reference.render(), (
        "docs/configuration-reference.md is stale: run `make docs`"
    )


def test_every_block_of_the_catalog_is_in_the_reference():
    """A model nested in the catalog but missing from BLOCKS would be a hole in the reference."""
    listed = {model for model, _ in config_reference.BLOCKS}
    seen, todo = set(), [config_reference.Catalog]
    while todo:
        model = todo.pop()
        seen.add(model)
        for field in model.model_fields.values():
            for candidate in _models_in(field.annotation):
                if candidate not in seen:
                    todo.append(candidate)
    assert seen == listed


def _models_in(annotation):
    import typing

    from pydantic import BaseModel

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for a in typing.get_args(annotation) for m in _models_in(a)]
