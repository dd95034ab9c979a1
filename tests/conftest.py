pytest_plugins = ["zeroth_pg.testing", "pytester"]
