"""Writes the web server's access log (combined log format) to stdout, deterministically.

Run once while the image is built. A small linear congruential generator, not `random`, so
the log is the same whatever the Python version.
"""

state = 20240317


def pick(n):
    global state
    state = (state * 1103515245 + 12345) % 2**31
    return (state >> 8) % n


# Weighted client pool: addresses that are prefixes of each other (10.0.0.1, 10.0.0.10,
# 10.0.0.100) catch a match on a substring rather than the whole field.
CLIENTS = (
    ["10.0.0.1"] * 9
    + ["10.0.0.10"] * 7
    + ["10.0.0.100"] * 5
    + ["192.168.4.23"] * 8
    + ["172.16.9.3"] * 6
    + ["10.0.0.7"] * 4
    + ["203.0.113.50"] * 3
    + ["198.51.100.8"] * 2
)
PATHS = [
    "/",
    "/index.html",
    "/api/items",
    "/api/items/42",
    "/login",
    "/static/app.js",
    "/404.html",
    "/old/page",
    "/api/orders?status=404",
]
STATUSES = [200] * 10 + [304] * 2 + [404] * 5 + [500]
AGENTS = ["Mozilla/5.0 (X11; Linux x86_64)", "curl/8.4.0", "probe-404/1.1", "python-requests/2.31"]
SIZES = [0, 404, 512, 1404, 2048, 4040]

for i in range(1500):
    second = i * 7
    hh, mm, ss = second // 3600 % 24, second // 60 % 60, second % 60
    stamp = f"17/Mar/2024:{hh:02d}:{mm:02d}:{ss:02d} +0000"
    client = CLIENTS[pick(len(CLIENTS))]
    status = STATUSES[pick(len(STATUSES))]
    method = "POST" if pick(5) == 0 else "GET"
    path = PATHS[pick(len(PATHS))]
    size = 0 if status == 304 else SIZES[pick(len(SIZES))]
    agent = AGENTS[pick(len(AGENTS))]
    print(f'{client} - - [{stamp}] "{method} {path} HTTP/1.1" {status} {size} "-" "{agent}"')
