#!/usr/bin/env python3
"""The inventory service's start-up: reads and validates its INI configuration and the
inventory database, then reports that it is ready.

Usage: python3 /app/app.py [CONFIG]  (default: $INVENTORY_CONFIG or /app/config/app.ini)
"""

import configparser
import os
import sys

LEVELS = ("debug", "info", "warning", "error")
DB_MAGIC = "INVENTORY-DB v2"


class ConfigError(Exception):
    pass


def integer(section, key, lo, hi):
    raw = section.get(key)
    if raw is None:
        raise ConfigError(f"[{section.name}] {key} is missing")
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"[{section.name}] {key} must be an integer, not {raw!r}") from None
    if not lo <= value <= hi:
        raise ConfigError(f"[{section.name}] {key} must be between {lo} and {hi}, not {value}")
    return value


def required(parser, name, key):
    if not parser.has_section(name):
        raise ConfigError(f"section [{name}] is missing")
    value = parser[name].get(key, "").strip()
    if not value:
        raise ConfigError(f"[{name}] {key} is missing")
    return value


def count_items(path):
    if not os.path.isfile(path):
        raise ConfigError(f"[storage] path: no database at {path}")
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    if not lines or lines[0] != DB_MAGIC:
        raise ConfigError(f"[storage] path: {path} is not an inventory database")
    return len([line for line in lines[2:] if line.strip()])


def load(path):
    # strict: a section or key given twice is an error, not silently merged.
    parser = configparser.ConfigParser(strict=True, interpolation=None)
    try:
        with open(path, encoding="utf-8") as f:
            parser.read_file(f)
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e}") from None
    except configparser.Error as e:
        raise ConfigError(f"{path} is not valid INI: {e}") from None
    name = required(parser, "server", "name")
    host = required(parser, "server", "host")
    server = parser["server"]
    port = integer(server, "port", 1, 65535)
    workers = integer(server, "workers", 1, 64)
    timeout = integer(server, "timeout", 1, 3600)
    storage = required(parser, "storage", "path")
    level = required(parser, "logging", "level")
    if level not in LEVELS:
        raise ConfigError(f"[logging] level must be one of {', '.join(LEVELS)}, not {level!r}")
    log_file = required(parser, "logging", "file")
    if not os.path.isdir(os.path.dirname(log_file)):
        raise ConfigError(f"[logging] file: no directory for {log_file}")
    items = count_items(storage)
    return (
        f"{name} ready: listening on {host}:{port}, workers={workers}, timeout={timeout}s, "
        f"storage={storage} ({items} items), log level={level}"
    )


def main(argv):
    path = argv[1] if len(argv) > 1 else os.environ.get("INVENTORY_CONFIG", "/app/config/app.ini")
    try:
        print(load(path))
    except ConfigError as e:
        print(f"inventory: configuration error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
