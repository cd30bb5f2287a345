"""Every registered format module keeps the contract of ``cdc_platform/formats/contract.py``: its
names, and its functions' parameters and return types, so a module with a missing name or a wrong
signature fails here rather than inside a Spark job (or by breaking ``format: auto``)."""

import inspect
import types
from typing import Any

import pytest

from cdc_platform import formats
from cdc_platform.formats import contract, detect, json_records

WIRE_FORMATS = sorted(n for n, path in formats.FORMATS.items() if path != formats.AUTO_MODULE)


def _functions(protocol: type) -> list[str]:
    return [n for n in dir(protocol) if not n.startswith("_") and callable(getattr(protocol, n))]


def _signature_mismatches(module: Any, protocol: type) -> list[str]:
    """Each function of ``protocol`` whose signature in ``module`` differs (names, kinds,
    defaults and annotations of the parameters, return annotation)."""
    wrong = []
    for name in _functions(protocol):
        declared = inspect.signature(getattr(protocol, name), eval_str=True)
        expected = declared.replace(parameters=list(declared.parameters.values())[1:])  # self
        actual = inspect.signature(getattr(module, name), eval_str=True)
        if actual != expected:
            wrong.append(f"{name}{actual} is not {name}{expected}")
    return wrong


def _check_names(module: Any) -> None:
    assert isinstance(module.NAME, str)
    assert formats.FORMATS[module.NAME] == module.__name__  # its records' source_format
    assert isinstance(module.OPTIONS, dict)
    for option, allowed in module.OPTIONS.items():
        assert isinstance(option, str)
        assert allowed is None or (
            isinstance(allowed, tuple) and all(isinstance(v, str) for v in allowed)
        )


@pytest.mark.parametrize("name", formats.format_names())
def test_every_registered_name_gives_a_parser(name):
    module = formats.parser_for(name)
    assert isinstance(module, contract.Parser)
    _check_names(module)
    assert _signature_mismatches(module, contract.Parser) == []


@pytest.mark.parametrize("name", WIRE_FORMATS)
def test_every_wire_format_keeps_the_whole_contract(name):
    module = formats.format_for(name)
    assert isinstance(module, contract.Format)
    assert all(
        isinstance(path, tuple) and all(isinstance(step, str | int) for step in path)
        for path in module.IMAGE_PATHS
    )
    assert all(isinstance(p, str) and p.startswith("$.") for p in module.TOKEN_PATHS)
    assert all(
        isinstance(p, str) and p.startswith("$.") and test in json_records.CLAIM_TESTS
        for p, test in module.CLAIM_PATHS.items()
    )
    assert _signature_mismatches(module, contract.Format) == []


def test_auto_is_only_a_parser_and_asks_every_wire_format():
    auto = formats.parser_for("auto")
    assert not isinstance(auto, contract.Format)
    with pytest.raises(ValueError, match="not one"):
        formats.format_for("auto")
    # Every wire format module is asked for its claims (an alias such as lindorm only once).
    assert set(detect.candidates().values()) == {formats.format_for(n) for n in WIRE_FORMATS}


def test_a_module_with_a_missing_function_or_a_wrong_signature_is_caught():
    good = formats.format_for("ogg")
    fake = types.ModuleType("fake")
    for name in ("NAME", "OPTIONS", "IMAGE_PATHS", "TOKEN_PATHS", "CLAIM_PATHS", "parse",
                 "column_specs"):  # fmt: skip
        setattr(fake, name, getattr(good, name))
    assert not isinstance(fake, contract.Format)  # no claims

    def claims(keys, value, probe):  # right names, no annotations
        return good.claims(keys, value, probe)

    fake.claims = claims
    assert isinstance(fake, contract.Format)  # presence alone passes ...
    assert _mismatched(fake) == ["claims"]  # ... the signature does not

    def parse(raw, options, extra=None):
        return raw

    fake.parse, fake.claims = parse, good.claims
    assert _mismatched(fake) == ["parse"]


def _mismatched(module: Any) -> list[str]:
    return [m.split("(")[0] for m in _signature_mismatches(module, contract.Format)]
