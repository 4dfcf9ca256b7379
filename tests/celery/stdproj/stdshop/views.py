from django.http import HttpRequest, HttpResponse


def ping(request: HttpRequest) -> HttpResponse:
    return HttpResponse("pong")
