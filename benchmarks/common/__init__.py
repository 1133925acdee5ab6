"""What the benchmark scripts share: launching jobs (``launch``) and studies (``study``), writing
a section of a results page (``sections``), timing against another framework (``versus``).

A script in ``benchmarks/KIND/`` puts the checkout first on its path, then imports from here::

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from benchmarks.common.launch import train_run
"""
