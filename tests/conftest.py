pytest_plugins = ["tests.fixtures.moto"]
