"""``python -m services`` runs the hami-accounting CLI (same as ``python -m services.cli``)."""

from services.cli.app import main

if __name__ == "__main__":
    raise SystemExit(main())
