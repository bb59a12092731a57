#!/bin/bash
# Gold solution: one [server] section (the duplicate held the timeout), the [storage] header
# closed, integers where integers are wanted, a known log level, and the database's real
# location.
set -euo pipefail
db=$(grep -rl --include='*.db' '^INVENTORY-DB v2$' /app | head -n 1)
[ -n "$db" ]
cat > /app/config/app.ini <<INI
# Configuration of the inventory service (read by /app/app.py).

[server]
name = inventory
host = 127.0.0.1
port = 8443
workers = 4
timeout = 30

[storage]
path = $db

[logging]
level = info
file = /app/logs/inventory.log
INI
python3 /app/app.py
