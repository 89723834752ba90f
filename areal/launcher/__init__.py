"""AReaL's launchers: ``python3 -m areal.launcher.local <script> --config <yaml> key=value``."""
