"""A per-table mode option: one mode for every table, or a mapping naming tables.

The ``deletes`` (``formats/deletes.py``) and ``history`` (``formats/history.py``) options take this
shape, given in Python, as JSON, or as a template renders either (``formats/rendered.py``): ``"soft"``
for every table, ``{"public.orders": "soft"}`` naming tables (a table it does not name keeps the mode
its lake table records). Standard library only: the Airflow side checks an option before a job is
submitted, and the Spark job ships this module to read it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar, cast

from airflow_provider_postgres_cdc.errors import BACKFILL
from airflow_provider_postgres_cdc.formats.manifest import Manifest
from airflow_provider_postgres_cdc.formats.rendered import rendered_value

ModesOption = str | dict[str, str] | None
GivenModes = str | Mapping[str, str] | None
"""A parsed option of any per-table mode (a mapping of its own modes, which is a Mapping[str, str])."""


def parse_modes(
    option: str | Mapping[str, str] | None,
    name: str,
    modes: tuple[str, ...],
    error: Callable[[str], Exception],
) -> ModesOption:
    """Option ``name`` as given, checked against ``modes``; a bad one raises ``error(message)``.

    ``None`` or an empty text or mapping: no table is named, each keeps its mode.
    """
    if option is None or (isinstance(option, str) and not option.strip()):
        return None
    if isinstance(option, str) and option.strip() not in modes:
        try:
            option = rendered_value(option)  # type: ignore[assignment]
        except ValueError:
            raise error(_shape(name, modes, option)) from None
    if isinstance(option, str):
        if option.strip() in modes:
            return option.strip()
        raise error(_shape(name, modes, option))
    if not isinstance(option, Mapping):
        raise error(_shape(name, modes, option))
    named: dict[str, str] = {}
    for table, mode in option.items():
        if not isinstance(table, str) or "." not in table:
            raise error(f"{name}: {table!r} is not a schema.table name")
        if mode not in modes:
            raise error(f"{name}[{table!r}] must be {_either(modes, repr)}, not {mode!r}")
        named[table] = mode
    return named or None


def _either(modes: tuple[str, ...], shown: Callable[[str], str]) -> str:
    return " or ".join(shown(mode) for mode in modes)


def _shape(name: str, modes: tuple[str, ...], option: object) -> str:
    return (
        f"{name} is {_either(modes, json.dumps)} for every table, or "
        f'{{"schema.table": {json.dumps(modes[-1])}, ...}} naming tables, not {option!r}'
    )


def option_text(option: GivenModes) -> str:
    """The option as the job's command-line option takes it (empty: no table named)."""
    return json.dumps(dict(option)) if isinstance(option, Mapping) else (option or "")


def mode_for(option: GivenModes, qualified: str) -> str | None:
    """The mode the option asks of a table; None when it does not name it (it keeps its own)."""
    if isinstance(option, Mapping):
        return option.get(qualified)
    return option


M = TypeVar("M", bound=str)


@dataclass(frozen=True)
class TableMode(Generic[M]):
    """A per-table mode option: its ``name``, its ``modes`` (the first is what a table not loaded
    under the option has), the table ``property`` recording a table's mode, the mode that needs a
    key (``keyed``: ``why_keyed`` says what for) and the ``error`` its refusals raise."""

    name: str
    modes: tuple[M, ...]
    property: str
    keyed: M
    why_keyed: str
    error: Callable[[str], Exception]

    def parse(self, option: GivenModes) -> M | dict[str, M] | None:
        """The option as given (a mode, a mapping, or the mapping's JSON text), checked.

        ``None`` or an empty text or mapping: no table is named, each keeps its mode.
        """
        return cast("M | dict[str, M] | None", parse_modes(option, self.name, self.modes, self.error))

    def mode_for(self, option: GivenModes, qualified: str) -> M | None:
        """The mode the option asks of a table; None when it does not name it (it keeps its own)."""
        return cast("M | None", mode_for(option, qualified))

    def recorded(self, properties: Mapping[str, str]) -> M:
        """The mode a lake table was loaded with, from its properties."""
        value = properties.get(self.property)
        return next((mode for mode in self.modes if mode == value), self.modes[0])

    def for_load(self, option: GivenModes, qualified: str, properties: Mapping[str, str] | None) -> M:
        """The mode a load gives a table: the option's, or (not named) the one the table was loaded
        with (``properties``; None: no table yet, which gets the first mode)."""
        kept = self.recorded(properties) if properties is not None else self.modes[0]
        return self.mode_for(option, qualified) or kept

    def for_batch(self, option: GivenModes, qualified: str, properties: Mapping[str, str] | None) -> M:
        """The mode a batch applies to a table: :meth:`for_load`'s, refused when it is not the one
        the table was loaded with (only a load may switch it)."""
        mode = self.for_load(option, qualified, properties)
        if properties is not None and mode != self.recorded(properties):
            raise self.changed_error(qualified, self.recorded(properties), mode)
        return mode

    def check_manifest(self, manifest: Manifest, option: GivenModes) -> None:
        """Refuse the keyed mode for a table of the manifest whose changes carry no key."""
        for spec in manifest.tables:
            if self.mode_for(option, spec.qualified) == self.keyed and spec.counts_rows:
                identity = "FULL" if spec.replica_identity == "f" else "NOTHING or no primary key"
                raise self.error(
                    f"{self.name}={self.keyed!r} for {spec.qualified}: its changes carry no key (REPLICA "
                    f"IDENTITY {identity}), so {self.why_keyed}. Give it a primary key (or REPLICA "
                    "IDENTITY USING INDEX) and re-snapshot it, or leave it out of the option; nothing "
                    "was applied"
                )

    def changed_error(self, qualified: str, recorded: M, wanted: M) -> Exception:
        """A batch asked for another mode than the table was loaded with: how a re-snapshot switches it."""
        conf = json.dumps({"tables": [qualified], self.name: {qualified: wanted}})
        return self.error(
            f"{qualified} holds rows applied with {self.name}={recorded!r}; a batch cannot switch it "
            f"to {wanted!r}. Re-snapshot the table under the new option with {BACKFILL} (--conf "
            f"'{conf}' with the pipeline's slot_name and staging), and give the CDC DAG the same "
            "option; or keep the option as it was. Nothing of this batch was applied to it"
        )
