"""One line of `collector why --json`'s shares: live bytes at the moment, and the percentages
named by recorded holders, by inferred ones, and in all; then a CHECK line (tests/gpu/checks.py):
named in all at least 99 % (tests/gpu/holders.sh holds the recorded share alone to that bound).
Exits 1 below it.

    python holders_share.py WHY.json LABEL
"""
import json
import sys

from checks import check

w = json.load(open(sys.argv[1]))
live = w["live_bytes"] or 1
pct = {k: 100 * w[k] / live for k in ("recorded_bytes", "inferred_bytes", "named_bytes")}
print(
    f"holders {sys.argv[2]:24s} live {w['live_bytes']:>12d}  recorded {pct['recorded_bytes']:5.1f} %  "
    f"inferred {pct['inferred_bytes']:5.1f} %  named {pct['named_bytes']:5.1f} %"
)
named = pct["named_bytes"]
sys.exit(0 if check(f"holders.{sys.argv[2]}.named_at_peak", f"{named:.2f}%", ">=99%", named >= 99.0, f"recorded {pct['recorded_bytes']:.2f} %") else 1)
