"""Writes the meter readings CSV files under /app/var/spool/meters, deterministically.

Run once while the image is built. A small linear congruential generator, not `random`, so
the files are the same whatever the Python version. Several days' files, so that reading the
wrong one gives a different answer; meters M-070 and M-17 catch substring matches on M-07.
"""

import os

OUT = "/app/var/spool/meters"
METERS = ["M-01", "M-02", "M-03", "M-05", "M-07", "M-070", "M-11", "M-17"]
state = 31337


def pick(n):
    global state
    state = (state * 1103515245 + 12345) % 2**31
    return (state >> 8) % n


os.makedirs(OUT, exist_ok=True)
for day in ("20240315", "20240316", "20240317", "20240318"):
    with open(os.path.join(OUT, f"readings-{day}.csv"), "w") as f:
        f.write("timestamp,meter,kwh\n")
        for slot in range(96):  # every 15 minutes
            stamp = f"{day[:4]}-{day[4:6]}-{day[6:]}T{slot // 4:02d}:{slot % 4 * 15:02d}:00"
            for meter in METERS:
                if pick(4) == 0:
                    continue  # not every meter reports in every slot
                cents = pick(250) + 1
                f.write(f"{stamp},{meter},{cents // 100}.{cents % 100:02d}\n")
