def mean(xs):
    raise NotImplementedError


def median(xs):
    raise NotImplementedError


def spread(xs):
    raise NotImplementedError
