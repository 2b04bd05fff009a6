//! The plugins an experiment file can name: the built-in list below, plus whatever a user's
//! crate registers at start-up ([`Plugins`], `rlany::main_with`).
//!
//! The macro turns the built-in list into the enums an experiment file names
//! (`environment: Arith(...)`, `adaptation: Gp(...)`) and into the dispatch the framework
//! calls through [`EnvironmentChoice`] and [`AdaptationChoice`]. Each enum has one more
//! variant, `Registered`, that holds a plugin registered by a user's crate under its own
//! name: its settings are read and written in the same typed pass (errors keep file, line
//! and column), and nothing in this crate names it. Adding a built-in plugin is one line of
//! the list; adding one outside this repository is one call of [`Plugins::environment`] or
//! [`Plugins::proposer`] (docs/extend.md).

use rlany_framework::plugin::{
    AdaptationChoice, EnvironmentChoice, EnvironmentPlugin, ProposerPlugin, ThresholdSpec,
};
use serde::de::{self, DeserializeOwned, DeserializeSeed, EnumAccess, VariantAccess};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::any::Any;
use std::fmt;
use std::sync::RwLock;

/// A registered plugin's settings, its type erased: what [`Registered`] holds.
pub trait Settings: Send + Sync {
    /// The settings as `Any` (equality, and a caller that knows the type).
    fn as_any(&self) -> &dyn Any;
    /// A boxed copy.
    fn clone_box(&self) -> Box<dyn Settings>;
    /// Whether `other` holds equal settings of the same type.
    fn eq_dyn(&self, other: &dyn Settings) -> bool;
    /// The settings to serialise.
    fn erased(&self) -> &dyn erased_serde::Serialize;
    /// `{:?}` of the settings.
    fn debug(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result;
    /// The environment plugin they are, if they are one.
    fn environment(&self) -> Option<&dyn EnvironmentPlugin>;
    /// The proposer plugin they are, if they are one.
    fn proposer(&self) -> Option<&dyn ProposerPlugin>;
}

/// What every plugin's settings type is: serde both ways, `Default` (the settings `rlany env
/// NAME` shows), comparable, printable.
pub trait SettingsType:
    Serialize + DeserializeOwned + Default + Clone + PartialEq + fmt::Debug + Send + Sync + 'static
{
}
impl<T> SettingsType for T where
    T: Serialize
        + DeserializeOwned
        + Default
        + Clone
        + PartialEq
        + fmt::Debug
        + Send
        + Sync
        + 'static
{
}

/// Settings of type `T`, with how they are a plugin.
struct Typed<T> {
    value: T,
    as_environment: Option<fn(&T) -> &dyn EnvironmentPlugin>,
    as_proposer: Option<fn(&T) -> &dyn ProposerPlugin>,
}

impl<T: SettingsType> Settings for Typed<T> {
    fn as_any(&self) -> &dyn Any {
        &self.value
    }
    fn clone_box(&self) -> Box<dyn Settings> {
        Box::new(Typed {
            value: self.value.clone(),
            as_environment: self.as_environment,
            as_proposer: self.as_proposer,
        })
    }
    fn eq_dyn(&self, other: &dyn Settings) -> bool {
        other
            .as_any()
            .downcast_ref::<T>()
            .is_some_and(|o| *o == self.value)
    }
    fn erased(&self) -> &dyn erased_serde::Serialize {
        &self.value
    }
    fn debug(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.value.fmt(f)
    }
    fn environment(&self) -> Option<&dyn EnvironmentPlugin> {
        self.as_environment.map(|a| a(&self.value))
    }
    fn proposer(&self) -> Option<&dyn ProposerPlugin> {
        self.as_proposer.map(|a| a(&self.value))
    }
}

/// A plugin registered by a user's crate: its name (as experiment files spell it) and its
/// settings.
pub struct Registered {
    /// The name experiment files use (`environment: Countdown(...)`).
    pub name: &'static str,
    /// The settings.
    pub settings: Box<dyn Settings>,
}

impl Registered {
    /// The settings as `T`, if they are.
    pub fn get<T: 'static>(&self) -> Option<&T> {
        self.settings.as_any().downcast_ref()
    }
}

impl Clone for Registered {
    fn clone(&self) -> Self {
        Self {
            name: self.name,
            settings: self.settings.clone_box(),
        }
    }
}

impl PartialEq for Registered {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name && self.settings.eq_dyn(other.settings.as_ref())
    }
}

impl fmt::Debug for Registered {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}(", self.name)?;
        self.settings.debug(f)?;
        write!(f, ")")
    }
}

/// Reads one registered plugin's settings from any deserializer.
type ReadSettings =
    fn(&mut dyn erased_serde::Deserializer<'_>) -> Result<Box<dyn Settings>, erased_serde::Error>;

/// How one registered plugin's settings are read.
#[derive(Clone, Copy)]
struct Entry {
    name: &'static str,
    read: ReadSettings,
    default: fn() -> Box<dyn Settings>,
}

/// The plugins registered by a user's crate (environments, proposers), read by every
/// experiment file of the process.
static REGISTERED: RwLock<(Vec<Entry>, Vec<Entry>)> = RwLock::new((Vec::new(), Vec::new()));

/// The plugins of a binary: the built-in ones and a user's, registered by name.
///
/// ```ignore
/// fn main() -> std::process::ExitCode {
///     rlany::main_with(rlany::Plugins::builtin().environment::<CountdownSpec>("Countdown"))
/// }
/// ```
#[derive(Clone, Default)]
pub struct Plugins {
    environments: Vec<Entry>,
    proposers: Vec<Entry>,
}

impl fmt::Debug for Plugins {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = |v: &[Entry]| v.iter().map(|e| e.name).collect::<Vec<_>>();
        f.debug_struct("Plugins")
            .field("environments", &names(&self.environments))
            .field("proposers", &names(&self.proposers))
            .finish()
    }
}

/// A registration that cannot be taken.
#[derive(Debug, thiserror::Error)]
#[error("plugin `{name}`: {why}")]
pub struct RegistrationError {
    /// The name asked for.
    pub name: String,
    /// Why not.
    pub why: String,
}

impl Plugins {
    /// The built-in plugins only.
    pub fn builtin() -> Self {
        Self::default()
    }

    /// Adds the environment plugin whose settings are `S`, named `name` in experiment files
    /// (`environment: Name(...)`, `rlany env name`).
    pub fn environment<S: SettingsType + EnvironmentPlugin>(mut self, name: &'static str) -> Self {
        self.environments.push(Entry {
            name,
            read: |d| Ok(as_environment(erased_serde::deserialize::<S>(d)?)),
            default: || as_environment(S::default()),
        });
        self
    }

    /// Adds the difficulty proposer whose settings are `S`, named `name` in experiment files
    /// (`adaptation: Name(...)`).
    pub fn proposer<S: SettingsType + ProposerPlugin>(mut self, name: &'static str) -> Self {
        self.proposers.push(Entry {
            name,
            read: |d| Ok(as_proposer(erased_serde::deserialize::<S>(d)?)),
            default: || as_proposer(S::default()),
        });
        self
    }

    /// Makes these plugins known to every experiment file this process reads: a name that
    /// is not an identifier, or already taken (by a built-in plugin or an earlier
    /// registration), is refused.
    pub fn install(self) -> Result<(), RegistrationError> {
        let mut reg = REGISTERED.write().unwrap_or_else(|e| e.into_inner());
        let (envs, props) = &mut *reg;
        for (new, builtin, registered) in [
            (&self.environments, ENVIRONMENTS, envs),
            (&self.proposers, PROPOSERS, props),
        ] {
            for e in new {
                let refuse = |why: &str| RegistrationError {
                    name: e.name.to_string(),
                    why: why.to_string(),
                };
                let mut chars = e.name.chars();
                if !chars.next().is_some_and(|c| c.is_ascii_uppercase())
                    || !chars.all(|c| c.is_ascii_alphanumeric())
                {
                    return Err(refuse(
                        "a plugin's name is an identifier in UpperCamelCase (`Countdown`)",
                    ));
                }
                if builtin.contains(&e.name) || registered.iter().any(|r| r.name == e.name) {
                    return Err(refuse("the name is taken"));
                }
                registered.push(*e);
            }
        }
        Ok(())
    }
}

/// Settings that are an environment plugin.
fn as_environment<S: SettingsType + EnvironmentPlugin>(value: S) -> Box<dyn Settings> {
    Box::new(Typed {
        value,
        as_environment: Some(|s: &S| s as &dyn EnvironmentPlugin),
        as_proposer: None,
    })
}

/// Settings that are a proposer plugin.
fn as_proposer<S: SettingsType + ProposerPlugin>(value: S) -> Box<dyn Settings> {
    Box::new(Typed {
        value,
        as_environment: None,
        as_proposer: Some(|s: &S| s as &dyn ProposerPlugin),
    })
}

/// The index serde gives the variant `name` of an enum whose built-in variants are `names`
/// (a registered plugin's: one past them).
fn variant_index(names: &[&str], name: &str) -> u32 {
    names.iter().position(|n| *n == name).unwrap_or(names.len()) as u32
}

/// The registered environment (`which = 0`) or proposer (`1`) plugin `name`.
fn registered(which: usize, name: &str) -> Option<Entry> {
    let reg = REGISTERED.read().unwrap_or_else(|e| e.into_inner());
    let list = if which == 0 { &reg.0 } else { &reg.1 };
    list.iter().find(|e| e.name == name).copied()
}

/// The names of the registered environment (`0`) or proposer (`1`) plugins.
fn registered_names(which: usize) -> Vec<&'static str> {
    let reg = REGISTERED.read().unwrap_or_else(|e| e.into_inner());
    let list = if which == 0 { &reg.0 } else { &reg.1 };
    list.iter().map(|e| e.name).collect()
}

/// Every environment plugin this process knows, built in then registered, by name.
pub fn environment_names() -> Vec<&'static str> {
    let mut names = ENVIRONMENTS.to_vec();
    names.extend(registered_names(0));
    names
}

/// The default settings of every environment plugin this process knows (what `rlany env
/// NAME` starts from), built in then registered: what the conformance test walks.
pub fn default_environments() -> Vec<(&'static str, Result<EnvironmentSpec, String>)> {
    environment_names()
        .into_iter()
        .map(|name| (name, EnvironmentSpec::default_of(name)))
        .collect()
}

/// Reads a registered plugin's settings through the entry's reader.
struct ReadRegistered(Entry);

impl<'de> DeserializeSeed<'de> for ReadRegistered {
    type Value = Registered;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Registered, D::Error> {
        let mut erased = <dyn erased_serde::Deserializer>::erase(d);
        let settings = (self.0.read)(&mut erased).map_err(de::Error::custom)?;
        Ok(Registered {
            name: self.0.name,
            settings,
        })
    }
}

/// A variant's name: as text (a file) or as an index into the built-in names (a format
/// that names variants by number, and the schema tracer of the docs test).
struct VariantName<const W: usize>(String);

impl<'de, const W: usize> Deserialize<'de> for VariantName<W> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<const W: usize>;
        impl<const W: usize> de::Visitor<'_> for V<W> {
            type Value = VariantName<W>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a plugin's name")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<VariantName<W>, E> {
                Ok(VariantName(v.to_string()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<VariantName<W>, E> {
                let names = if W == 0 { ENVIRONMENTS } else { ADAPTATIONS };
                names
                    .get(v as usize)
                    .map(|n| VariantName(n.to_string()))
                    .ok_or_else(|| E::custom(format!("no plugin number {v}")))
            }
        }
        d.deserialize_identifier(V::<W>)
    }
}

/// The error of a name that is no plugin of this binary.
fn unknown<E: de::Error>(what: &str, name: &str, known: &[&str]) -> E {
    E::custom(format!(
        "unknown {what} `{name}`, expected one of {}",
        known
            .iter()
            .map(|k| format!("`{k}`"))
            .collect::<Vec<_>>()
            .join(", ")
    ))
}

macro_rules! plugins {
    (
        environments { $( $(#[$em:meta])* $env:ident($env_ty:ty), )+ }
        proposers { $( $(#[$pm:meta])* $prop:ident($prop_ty:ty), )* }
    ) => {
        /// The environment plugins an experiment file can name.
        #[derive(Debug, Clone, PartialEq)]
        pub enum EnvironmentSpec {
            $( $(#[$em])* $env($env_ty), )+
            /// An environment registered by a user's crate ([`Plugins::environment`]).
            Registered(Registered),
        }

        /// The names of the built-in environment plugins, as experiment files spell them.
        pub const ENVIRONMENTS: &[&str] = &[ $( stringify!($env), )+ ];

        /// The names of the built-in proposer plugins.
        pub const PROPOSERS: &[&str] = &[ $( stringify!($prop), )* ];

        /// The names of the built-in adaptation rules, as experiment files spell them.
        pub const ADAPTATIONS: &[&str] = &["Static", "Threshold", $( stringify!($prop), )*];

        impl EnvironmentChoice for EnvironmentSpec {
            fn plugin(&self) -> &dyn EnvironmentPlugin {
                match self {
                    $( Self::$env(s) => s, )+
                    Self::Registered(r) => r
                        .settings
                        .environment()
                        .expect("registered as an environment"),
                }
            }
        }

        impl EnvironmentSpec {
            /// The default settings of the environment plugin `name` (built in or
            /// registered), or why there are none.
            pub fn default_of(name: &str) -> Result<Self, String> {
                if let Some(e) = registered(0, name) {
                    return Ok(Self::Registered(Registered {
                        name: e.name,
                        settings: (e.default)(),
                    }));
                }
                ron::Options::default()
                    .with_default_extension(ron::extensions::Extensions::UNWRAP_VARIANT_NEWTYPES)
                    .from_str(&format!("{name}()"))
                    .map_err(|e| e.to_string())
            }
        }

        impl Serialize for EnvironmentSpec {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let (name, value): (&'static str, &dyn erased_serde::Serialize) = match self {
                    $( Self::$env(v) => (stringify!($env), v), )+
                    Self::Registered(r) => (r.name, r.settings.erased()),
                };
                let i = variant_index(ENVIRONMENTS, name);
                s.serialize_newtype_variant("EnvironmentSpec", i, name, value)
            }
        }

        impl<'de> Deserialize<'de> for EnvironmentSpec {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V;
                impl<'de> de::Visitor<'de> for V {
                    type Value = EnvironmentSpec;
                    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                        f.write_str("an environment plugin, `Name(settings)`")
                    }
                    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<EnvironmentSpec, A::Error> {
                        let (name, variant): (VariantName<0>, _) = data.variant()?;
                        match name.0.as_str() {
                            $( stringify!($env) => variant.newtype_variant().map(EnvironmentSpec::$env), )+
                            other => match registered(0, other) {
                                Some(e) => variant
                                    .newtype_variant_seed(ReadRegistered(e))
                                    .map(EnvironmentSpec::Registered),
                                None => Err(unknown("environment", other, &environment_names())),
                            },
                        }
                    }
                }
                d.deserialize_enum("EnvironmentSpec", ENVIRONMENTS, V)
            }
        }

        /// How task difficulty adapts: the method's own rules and the proposer plugins.
        #[derive(Debug, Clone, PartialEq, Default)]
        pub enum AdaptationSpec {
            /// Difficulty never changes.
            #[default]
            Static,
            /// The paper's rule: move the difficulty by a fixed step along the flagged
            /// dimensions.
            Threshold(ThresholdSpec),
            $( $(#[$pm])* $prop($prop_ty), )*
            /// A proposer registered by a user's crate ([`Plugins::proposer`]).
            Registered(Registered),
        }

        impl AdaptationChoice for AdaptationSpec {
            fn plugin(&self) -> Option<&dyn ProposerPlugin> {
                match self {
                    Self::Static => None,
                    Self::Threshold(s) => Some(s),
                    $( Self::$prop(s) => Some(s), )*
                    Self::Registered(r) => r.settings.proposer(),
                }
            }
        }

        impl Serialize for AdaptationSpec {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let (name, value): (&'static str, &dyn erased_serde::Serialize) = match self {
                    Self::Static => return s.serialize_unit_variant("AdaptationSpec", 0, "Static"),
                    Self::Threshold(t) => ("Threshold", t),
                    $( Self::$prop(v) => (stringify!($prop), v), )*
                    Self::Registered(r) => (r.name, r.settings.erased()),
                };
                let i = variant_index(ADAPTATIONS, name);
                s.serialize_newtype_variant("AdaptationSpec", i, name, value)
            }
        }

        impl<'de> Deserialize<'de> for AdaptationSpec {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V;
                impl<'de> de::Visitor<'de> for V {
                    type Value = AdaptationSpec;
                    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                        f.write_str("`Static`, `Threshold(...)` or a proposer plugin")
                    }
                    fn visit_str<E: de::Error>(self, v: &str) -> Result<AdaptationSpec, E> {
                        match v {
                            "Static" => Ok(AdaptationSpec::Static),
                            other => Err(unknown("adaptation", other, &adaptation_names())),
                        }
                    }
                    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<AdaptationSpec, A::Error> {
                        let (name, variant): (VariantName<1>, _) = data.variant()?;
                        match name.0.as_str() {
                            "Static" => variant.unit_variant().map(|()| AdaptationSpec::Static),
                            "Threshold" => variant.newtype_variant().map(AdaptationSpec::Threshold),
                            $( stringify!($prop) => variant.newtype_variant().map(AdaptationSpec::$prop), )*
                            other => match registered(1, other) {
                                Some(e) => variant
                                    .newtype_variant_seed(ReadRegistered(e))
                                    .map(AdaptationSpec::Registered),
                                None => Err(unknown("adaptation", other, &adaptation_names())),
                            },
                        }
                    }
                }
                d.deserialize_enum("AdaptationSpec", ADAPTATIONS, V)
            }
        }
    };
}

/// Every adaptation rule this process knows: `Static`, `Threshold`, the built-in proposers,
/// then the registered ones.
pub fn adaptation_names() -> Vec<&'static str> {
    let mut names = ADAPTATIONS.to_vec();
    names.extend(registered_names(1));
    names
}

plugins! {
    environments {
        /// Multi-step arithmetic chains (`rlany_envs::arith`).
        Arith(rlany_envs::ArithSpec),
        /// Programs in a tiny list language judged by hidden tests (`rlany_envs::codegen`).
        Codegen(rlany_envs::CodegenSpec),
        /// Doors answered `L` or `R` by a digit sign, the positive control for step credit
        /// (`rlany_envs::corridor`).
        Corridor(rlany_envs::CorridorSpec),
        /// A text household game like AlfWorld (`rlany_envs::household`).
        Household(rlany_envs::HouseholdSpec),
        /// Computer control on a simulated editor, like OSWorld (`rlany_envs::desktop`).
        Desktop(rlany_envs::DesktopSpec),
        /// An environment in another process, spoken to in JSON lines (`rlany_envs::process`).
        Process(rlany_envs::ProcessSpec),
    }
    proposers {
        /// Our Gaussian-process proposer (`rlany_envs::proposers::gp`).
        Gp(rlany_envs::proposers::GpSpec),
    }
}

/// An experiment file of this build: the framework's schema over this list of plugins.
pub type Experiment = rlany_framework::Experiment<EnvironmentSpec, AdaptationSpec>;

#[cfg(test)]
mod tests {
    use super::*;
    use rlany_framework::check::Checked;
    use rlany_framework::{Difficulty, Environment};

    /// Every environment plugin this binary knows keeps the contract at its default settings:
    /// the list walked is the plugin list itself, so a new plugin is checked without being
    /// named here. A default that cannot start alone (`Process` names no command) is left to
    /// its own checks (`rlany env process -- CMD`), and said.
    #[test]
    fn every_environment_plugin_passes_the_conformance_checks() {
        let mut checked = Vec::new();
        for (name, spec) in default_environments() {
            let spec = spec.unwrap_or_else(|e| panic!("{name}: {e}"));
            if let Err(e) = spec.plugin().validate() {
                assert_eq!(name, "Process", "{name}: its default settings: {e:?}");
                continue;
            }
            let env = spec.plugin().build();
            let checks =
                rlany_envs::conformance::run(&rlany_envs::conformance::Compiled(env.as_ref()));
            for c in &checks {
                assert!(c.ok, "{name}: {} failed: {}", c.name, c.detail);
            }
            checked.push(name);
        }
        assert!(checked.len() >= 5, "{checked:?}");
    }

    /// A user's settings type, registered by name.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, default)]
    struct ShortSpec {
        length: usize,
    }
    impl Default for ShortSpec {
        fn default() -> Self {
            Self { length: 5 }
        }
    }
    impl EnvironmentPlugin for ShortSpec {
        fn validate(&self) -> Checked {
            rlany_framework::check::count("length", self.length, 1, 30)
        }
        fn start_difficulty(&self) -> Difficulty {
            vec![1.0]
        }
        fn build(&self) -> Box<dyn Environment> {
            Box::new(rlany_envs::Corridor::new(self.length, self.length, 0))
        }
    }

    const FILE: &str = r#"Experiment(
        name: "short", seeds: [1],
        environment: ShortDoors(length: 7),
        policy: (model: Scratch(d_model: 8, layers: 1, heads: 1, kv_heads: 1, ffn: 8, max_seq_len: 64)),
        budget: (steps: 2, tasks_per_step: 2, group_size: 2, max_env_steps: 8, eval_every: 2,
                 eval_tasks: 4, checkpoint_every: 2),
    )"#;

    /// A registered environment is read, written and overridden like a built-in one, and
    /// found by `rlany env`'s name lookup; a taken or malformed name is refused.
    #[test]
    fn a_registered_environment_reads_writes_and_overrides_like_a_built_in_one() {
        Plugins::builtin()
            .environment::<ShortSpec>("ShortDoors")
            .install()
            .expect("registered");
        let exp = Experiment::parse(FILE, "short.ron".as_ref()).expect("parses");
        let EnvironmentSpec::Registered(r) = &exp.environment else {
            panic!("{:?}", exp.environment)
        };
        assert_eq!(r.get::<ShortSpec>(), Some(&ShortSpec { length: 7 }));
        assert_eq!(
            exp.environment.plugin().build().difficulty_space()[0].lo,
            7.0
        );
        // Written out and read back: the same experiment.
        let text = exp.to_ron();
        assert!(text.contains("ShortDoors("), "{text}");
        assert_eq!(
            Experiment::parse(&text, "again.ron".as_ref()).expect("re-parses"),
            exp
        );
        // `--set` goes through JSON.
        let set = crate::overrides::apply(&exp, &["environment.length=9".to_string()])
            .expect("overridden");
        let EnvironmentSpec::Registered(r) = &set.environment else {
            panic!("{:?}", set.environment)
        };
        assert_eq!(r.get::<ShortSpec>(), Some(&ShortSpec { length: 9 }));
        // A mistake inside the user's settings names the field and the line.
        let bad = FILE.replace("length: 7", "lenght: 7");
        let err = Experiment::parse(&bad, "bad.ron".as_ref())
            .expect_err("refused")
            .to_string();
        assert!(err.contains("lenght") && err.contains("bad.ron:3"), "{err}");
        // An unknown name lists the known ones, the registered one among them.
        let err = Experiment::parse(&FILE.replace("ShortDoors", "LongDoors"), "x.ron".as_ref())
            .expect_err("refused")
            .to_string();
        assert!(
            err.contains("`ShortDoors`") && err.contains("`Corridor`"),
            "{err}"
        );
        assert!(environment_names().contains(&"ShortDoors"));
        assert!(matches!(
            EnvironmentSpec::default_of("ShortDoors"),
            Ok(EnvironmentSpec::Registered(_))
        ));
        // Taken and malformed names.
        for name in ["Corridor", "ShortDoors", "short_doors"] {
            let refused = Plugins::builtin().environment::<ShortSpec>(name).install();
            assert!(refused.is_err(), "{name}");
        }
    }
}
