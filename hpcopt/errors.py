"""Errors that are the user's to fix: printed as one line, exit code 2, no traceback."""


class UserError(Exception):
    """Bad configuration, bad input file or an impossible request.

    The command-line front end prints ``hpcopt: error: <message>`` once (from rank 0) and
    exits with status 2 on every rank.
    """

    exit_code = 2
