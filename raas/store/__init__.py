"""Durable results (SQLite) and export."""
