import sys

from bench.run import main

if sys.argv[1:2] == ["race"]:  # python -m bench race ...: Spark's own Kafka source beside txstore
    from bench.race import main as race

    sys.exit(race(sys.argv[2:]))
sys.exit(main())
