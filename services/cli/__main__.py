"""``python -m services.cli`` runs the hami-accounting CLI."""

from services.cli.app import main

if __name__ == "__main__":
    raise SystemExit(main())
