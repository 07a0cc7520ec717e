"""Real sites: scenarios on real hourly prices and grid carbon, market-true forecasts and a
temporal split (train on past years, test on a year never seen).

A site is a signal file (UTC hourly price and carbon), its market's time zone and
publication time, and a fleet and workload taken from a catalog scenario. Shipped sites
``de_lu`` and ``caiso``; a user adds one from two CSV files (``cloudrl sites add``).
Modules: :mod:`.registry` (which sites exist), :mod:`.splits` (periods, slices, test
windows), :mod:`.scenario` (a site's scenario for a split part), :mod:`.forecast_eval`
(forecast error by lead), :mod:`.headroom` (controllers on the test windows), :mod:`.byo`
(validating a user's files), :mod:`.cli` (``cloudrl sites``), :mod:`.build_data` (the
shipped tables from the shared data).
"""
