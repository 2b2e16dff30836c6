"""Regenerates the shipped FSDD features from the WAV recordings, so the embedded file is
reproducible: ``python -m mgfl.data.build_embedded /path/to/fsdd/recordings``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from mgfl.data.fsdd import FSDD_ATTRIBUTION, Progress, clip_feature_matrix, find_clips
from mgfl.data.fsdd_embedded import EMBEDDED_DIR, EMBEDDED_FILE, EMBEDDED_OPTIONS, quantise_unit

ATTRIBUTION_FILE = "ATTRIBUTION.md"


def attribution_text() -> str:
    """The notice CC BY-SA 4.0 asks for: credit, license, what was changed, same license."""
    options = EMBEDDED_OPTIONS
    return f"""# Attribution for {EMBEDDED_FILE.name}

{FSDD_ATTRIBUTION}

Source: https://github.com/Jakobovski/free-spoken-digit-dataset (3,000 recordings: 6 speakers x
10 digits x 50 takes, 8 kHz mono WAV).

License of the source and of this derived file: Creative Commons Attribution-ShareAlike 4.0
International (CC BY-SA 4.0), https://creativecommons.org/licenses/by-sa/4.0/legalcode.
No warranties are given.

Changes made: the recordings are not included. For each recording, mgfl computed a log-mel
spectrogram with spafe ({options.mels} mel bands, {options.window_ms:g} ms Hamming window,
{options.hop_ms:g} ms hop, {options.nfft}-point FFT, pre-emphasis {options.pre_emphasis}),
expressed it in dB below the clip's peak floored at -{options.top_db:g} dB and scaled to [0, 1],
padded or cropped it to {options.frames} frames, and quantised it to 8 bits. The file also keeps
each recording's digit, speaker, take and file name. mgfl/data/build_embedded.py regenerates it.
"""


def build_embedded(
    recordings: Path,
    out_dir: Path = EMBEDDED_DIR,
    *,
    cache_dir: Path | None = None,
    progress: Progress | None = None,
) -> Path:
    """Computes the features of every recording and writes the compressed file and its
    attribution into ``out_dir``; returns the file's path."""
    clips = find_clips(Path(recordings))
    features, _, _ = clip_feature_matrix(
        clips, EMBEDDED_OPTIONS, cache_dir=cache_dir, progress=progress
    )
    speaker_names = sorted({clip.speaker for clip in clips})
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / EMBEDDED_FILE.name
    np.savez_compressed(
        target,
        codes=quantise_unit(features),
        digits=np.array([c.digit for c in clips], dtype=np.int8),
        speakers=np.array([speaker_names.index(c.speaker) for c in clips], dtype=np.int8),
        takes=np.array([c.take for c in clips], dtype=np.int16),
        names=np.array([c.path.name for c in clips]),
        speaker_names=np.array(speaker_names),
        options=np.array(json.dumps(EMBEDDED_OPTIONS.to_dict(), sort_keys=True)),
    )
    (out_dir / ATTRIBUTION_FILE).write_text(attribution_text(), encoding="utf-8")
    return target


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("recordings", type=Path, help="directory of FSDD WAV files")
    parser.add_argument("--out", type=Path, default=EMBEDDED_DIR, help="output directory")
    args = parser.parse_args(argv)

    from rich.progress import Progress as Bar

    with Bar(transient=True) as bar:
        task = bar.add_task("log-mel features", total=None)
        target = build_embedded(
            args.recordings, args.out, progress=lambda done, total: bar.update(
                task, completed=done, total=total
            )
        )
    print(f"wrote {target} ({target.stat().st_size / 2**20:.2f} MiB)")


if __name__ == "__main__":
    main()
