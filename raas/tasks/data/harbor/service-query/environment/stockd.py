#!/usr/bin/env python3
"""A small warehouse stock service: JSON over HTTP on 127.0.0.1:8080 (loopback only).

GET /                  -> a description of the endpoints
GET /items?page=N      -> one page of items (sku, category, stock), N from 1
GET /categories        -> each category's reorder level

The data is made at start-up by a small linear congruential generator, so it is the same on
every start (and in every Python version).
"""

import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

HOST, PORT = "127.0.0.1", 8080
PAGE_SIZE = 8

CATEGORIES = {
    "fasteners": {"prefix": "FS", "reorder_level": 150},
    "hinges": {"prefix": "HG", "reorder_level": 40},
    "tools": {"prefix": "TL", "reorder_level": 12},
    "paint": {"prefix": "PT", "reorder_level": 25},
    "cables": {"prefix": "CB", "reorder_level": 60},
}


def make_items(count=45):
    state = 7919
    names = sorted(CATEGORIES)
    items = []
    for i in range(count):
        state = (state * 1103515245 + 12345) % 2**31
        category = names[(state >> 8) % len(names)]
        state = (state * 1103515245 + 12345) % 2**31
        level = CATEGORIES[category]["reorder_level"]
        stock = (state >> 8) % (level * 3)
        if i % 11 == 5:
            stock = level  # exactly at the level: not below it
        sku = f"{CATEGORIES[category]['prefix']}-{1000 + 37 * i % 900}"
        items.append({"sku": sku, "category": category, "stock": stock})
    return items


ITEMS = make_items()
PAGES = (len(ITEMS) + PAGE_SIZE - 1) // PAGE_SIZE


class Handler(BaseHTTPRequestHandler):
    def send_json(self, status, body):
        data = json.dumps(body, indent=1).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        url = urlsplit(self.path)
        if url.path == "/":
            self.send_json(
                200,
                {
                    "service": "warehouse stock",
                    "endpoints": {
                        "/items?page=N": f"items, {PAGE_SIZE} a page, pages 1 to {PAGES}; "
                        "'next' is the next page's path, or null on the last",
                        "/categories": "each category's reorder level",
                    },
                },
            )
        elif url.path == "/items":
            try:
                page = int(parse_qs(url.query).get("page", ["1"])[0])
            except ValueError:
                page = 0
            if not 1 <= page <= PAGES:
                self.send_json(404, {"error": f"no page {page}; pages are 1 to {PAGES}"})
                return
            chunk = ITEMS[(page - 1) * PAGE_SIZE : page * PAGE_SIZE]
            nxt = f"/items?page={page + 1}" if page < PAGES else None
            self.send_json(200, {"page": page, "pages": PAGES, "items": chunk, "next": nxt})
        elif url.path == "/categories":
            self.send_json(
                200, {name: {"reorder_level": c["reorder_level"]} for name, c in CATEGORIES.items()}
            )
        else:
            self.send_json(404, {"error": f"no such endpoint: {url.path}; see GET /"})

    def log_message(self, format, *args):
        pass  # quiet: the container's output is not the place for an access log


if __name__ == "__main__":
    ThreadingHTTPServer.allow_reuse_address = True
    ThreadingHTTPServer((HOST, PORT), Handler).serve_forever()
