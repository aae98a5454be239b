"""(Re)generate the shipped fitted-published profiles: ``python -m calibration.published.ship``.

Every (model, TP degree) the published data covers on each GPU, where the model fits in memory, plus the
catalogue's Llama-3 models on the H100 (no rows there: the kernel model of the H100's five models prices
their operators from their shapes, and the profile's rules say so).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from calibration.published import vidur
from calibration.published.from_published import fit_published
from simulator.cost.profile import profiles_dir
from simulator.errors import ConfigError

TP_DEGREES = (1, 2, 4, 8)
EXTRA: dict[str, tuple[str, ...]] = {"H100": ("llama-3-8b", "llama-3-70b")}
"""Catalogue models without rows on a GPU that still get a profile there (from the kernel model)."""


def generate(out_dir: Path | None = None, *, data: Path | None = None, date: str | None = None
             ) -> tuple[list[Path], list[str]]:
    out_dir = out_dir or profiles_dir()
    data = data or vidur.DEFAULT_DATA
    written: list[Path] = []
    skipped: list[str] = []
    for hardware in vidur.GPU_FOLDERS:
        for model in (*vidur.available_models(data, hardware), *EXTRA.get(hardware, ())):
            for tp in TP_DEGREES:
                try:
                    profile = fit_published(model, hardware, tp, data=data, date=date).profile
                except (ConfigError, ValueError) as err:
                    skipped.append(f"{hardware} {model} tp{tp}: {getattr(err, 'message', err)}")
                    continue
                written.append(profile.save(out_dir / f"{profile.name}.yaml"))
                print(f"wrote {written[-1].name}  held-out MAPE {profile.fit_error.mape:.2%}"  # type: ignore[union-attr]
                      f"  max {profile.fit_error.max_error:.2%}", flush=True)  # type: ignore[union-attr]
    return written, skipped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="(Re)generate the shipped fitted-published profiles.")
    parser.add_argument("--out", type=Path, default=None, help="folder (default: calibration/profiles)")
    parser.add_argument("--data", type=Path, default=None, help="Vidur's profiles (default ../shared/...)")
    parser.add_argument("--date", default=None, help="provenance date (default: today)")
    args = parser.parse_args(argv)
    _, skipped = generate(args.out, data=args.data, date=args.date)
    for reason in skipped:
        print(f"skipped {reason}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
